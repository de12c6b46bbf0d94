# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "etc"

# Tests that fork, signal and wait: the master/worker lifecycle.
class ProcessLifecycleTest < ServerTest
  def test_graceful_term_finishes_the_request_in_flight_then_refuses_new_connections
    server = start_both(stats: true, app: "kitchen.ru")
    idle = server.tcp
    assert_equal 200, request(idle, "GET", "/hello").status # an idle keep-alive connection
    busy = server.unix
    busy.write("GET /sleep?t=1.5 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app(stats_path(server))
    server.signal(:TERM)
    res = read_response(busy, timeout: 10)
    assert_equal 200, res.status
    assert_equal "slept\n", res.body
    assert closed_by_peer?(busy), "then the connection is closed"
    assert closed_by_peer?(idle), "idle keep-alive connections are closed"
    status = server.wait_exit(15)
    assert status&.success?, "master exits 0 after a graceful stop"
    assert_raises(Errno::ECONNREFUSED, Errno::ENOENT) { server.tcp }
  ensure
    [idle, busy].each { |s| s&.close }
  end

  def test_int_is_graceful_too
    server = start_server(["-l", "127.0.0.1:0"])
    server.signal(:INT)
    assert server.wait_exit(15)&.success?
  end

  def test_a_killed_worker_is_replaced
    server = start_both(stats: true, app: "kitchen.ru")
    old = server.worker_pids.first
    io = server.tcp
    io.write("GET /sleep?t=5 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app(stats_path(server), old)
    Process.kill(:KILL, old)
    assert closed_by_peer?(io), "the client of the dead worker sees the connection end, not a hang"
    wait_for { (server.worker_pids - [old]).any? }
    assert_match(/worker 0 \(pid #{old}\) killed by SIGKILL; replacing it/, server.log)
    io2 = server.tcp
    assert_equal 200, request(io2, "GET", "/hello").status
  ensure
    io&.close
    io2&.close
  end

  def test_ttin_and_ttou
    server = start_server(["-l", "127.0.0.1:0"], workers: 1)
    server.signal(:TTIN)
    wait_for { server.log.include?("worker 1 (pid") }
    server.signal(:TTOU)
    wait_for { server.log.match?(/worker 1 \(pid \d+\) exited with status 0/) }
  end

  def test_request_timeout_answers_503_logs_and_replaces_the_worker
    server = start_server(["-l", "127.0.0.1:0", "--timeout", "1"], app: "kitchen.ru")
    old = server.worker_pids.first
    io = server.tcp
    res = request(io, "GET", "/sleep?t=30")
    assert_equal 503, res.status, "the client gets an answer, not a reset"
    assert_logged(server, %r{timeout: GET /sleep running for})
    assert_logged(server, %r{request timeout \(1s\): GET /sleep: Blackbuck::RequestTimeout})
    assert_match(/kitchen\.ru:\d+/, server.log, "with the backtrace of the stuck code")
    wait_for { (server.worker_pids - [old]).any? }
  ensure
    io&.close
  end

  def test_a_worker_that_ignores_the_timeout_is_killed_and_replaced
    server = start_server(["-l", "127.0.0.1:0", "--timeout", "1"], app: "kitchen.ru")
    old = server.worker_pids.first
    io = server.tcp
    io.write("GET /stubborn HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for(20) { server.log.include?("did not stop after the timeout; killing it") }
    wait_for(10) { server.log.match?(/worker 0 \(pid #{old}\) killed by SIGKILL/) }
    wait_for(10) { (server.worker_pids - [old]).any? }
    io2 = server.tcp
    assert_equal 200, request(io2, "GET", "/hello").status
  ensure
    io&.close
    io2&.close
  end

  # A recycled worker's idle keep-alive connections move to its sibling (Worker#retire) instead of
  # being drained and closed under a client that may send its next request at that moment: each
  # answers its next request after both original workers are gone. (Drained, each was closed.)
  def test_idle_keep_alive_connections_outlive_a_recycle
    server = start_both(["--max-requests-per-child", "20"], app: "refork.ru", workers: 2)
    idle = Array.new(4) { server.unix }
    first = idle.map { |io| pid_in(request(io, "GET", "/")) }
    originals = server.worker_pids.first(2)
    wait_for(60, "both original workers recycled") do
      io = server.tcp
      request(io, "GET", "/")
      io.close
      originals.all? { |pid| server.log.match?(/worker \d \(pid #{pid}\) exiting after/) }
    end
    idle.each_with_index do |io, i|
      res = request(io, "GET", "/")
      assert_equal 200, res&.status, "idle connection #{i} (first served by #{first[i]}) after the recycle:\n#{server.log}"
      refute_includes originals, pid_in(res)
    end
    assert_match(/moved \d+ idle connections to its siblings/, server.log)
  ensure
    idle&.each(&:close)
  end

  def pid_in(res) = Integer(res.body[/pid=(\d+)/, 1])

  def test_recycling_after_max_requests_with_jitter_and_no_failed_request
    server = start_server(["-l", "127.0.0.1:0", "--max-requests-per-child", "6", "--min-requests-per-child", "3"],
                          app: "kitchen.ru")
    pids = []
    30.times do
      io = server.tcp
      res = request(io, "GET", "/env")
      assert_equal 200, res.status
      pids << JSON.parse(res.body)["worker.pid"]
      io.close
    end
    runs = pids.chunk_while { |a, b| a == b }.map(&:size)
    assert_operator runs.size, :>=, 4, "30 requests at <= 6 per worker: at least 5 workers served"
    assert runs[0..-2].all? { |n| n.between?(3, 6) }, "each worker served between min and max: #{runs}"
  end

  def test_hup_replaces_every_worker
    server = start_server(["-l", "127.0.0.1:0"], workers: 2)
    old = server.worker_pids
    server.signal(:HUP)
    wait_for { (server.worker_pids - old).size >= 2 }
    io = server.tcp
    assert_equal 200, request(io, "GET", "/").status
  ensure
    io&.close
  end

  # "Pretend to be systemd" (and Server::Starter): the test binds, the server inherits.
  def test_inherits_listen_fds_and_server_starter_port
    sock = TCPServer.new("127.0.0.1", 0)
    port = sock.addr[1]
    dir = Dir.mktmpdir("bb-test")
    log = "#{dir}/log"
    script = "LISTEN_PID=$$ LISTEN_FDS=1 exec #{RbConfig.ruby} #{EXE} -w 1 #{APPS}/hello.ru"
    pid = Process.spawn("sh", "-c", script, 3 => sock, out: log, err: %i[child out], pgroup: true)
    Timeout.timeout(15) { sleep 0.05 until File.read(log).include?("ready") }
    assert_includes File.read(log), "listening on http://127.0.0.1:#{port} (inherited)"
    io = TCPSocket.new("127.0.0.1", port)
    assert_equal 200, request(io, "GET", "/").status
    io.close
    Process.kill(:TERM, pid)
    Process.wait(pid)
    pid = nil

    log = "#{dir}/log2"
    usock = UNIXServer.new("#{dir}/ss.sock")
    env = { "SERVER_STARTER_PORT" => "127.0.0.1:#{port}=3;#{dir}/ss.sock=4" }
    pid = Process.spawn(env, RbConfig.ruby, EXE, "-w", "1", "#{APPS}/hello.ru", 3 => sock, 4 => usock,
                        out: log, err: %i[child out], pgroup: true)
    Timeout.timeout(15) { sleep 0.05 until File.exist?(log) && File.read(log).include?("ready") }
    io = UNIXSocket.new("#{dir}/ss.sock")
    assert_equal 200, request(io, "GET", "/").status
    io.close
    Process.kill(:TERM, pid)
    Process.wait(pid)
    pid = nil
    assert File.socket?("#{dir}/ss.sock"), "an inherited UNIX socket is left for the next generation"
  ensure
    if pid
      Process.kill(:KILL, -pid)
      Process.wait(pid)
    end
    warn File.read(log) if log && !passed? && File.exist?(log)
  end
end

# Rhebok's workers spun at ~85% CPU when idle on Ruby 3; ours sleep in epoll_wait.
class IdleCPUTest < ServerTest
  def test_idle_workers_use_no_cpu
    server = start_server(["-l", "127.0.0.1:0"], workers: 2)
    sleep 0.5
    ticks = lambda do
      server.worker_pids.sum { |p| File.read("/proc/#{p}/stat").split(") ").last.split[11, 2].sum(&:to_i) }
    end
    before = ticks.call
    sleep 2
    used = (ticks.call - before) * 1000 / Etc.sysconf(Etc::SC_CLK_TCK)
    assert_operator used, :<, 100, "two idle workers used #{used} ms of CPU in 2 s"
  end
end

# max_memory_per_child counts USS: the pages a worker alone maps, not those it shares with the
# master. shared_heap.ru's master holds 64 MiB of strings made before the fork.
class MemoryRecyclingTest < ServerTest
  SHARED_LIMIT = 40_000 # KiB: under a shared_heap.ru worker's RSS (64 MiB shared and more), over its USS

  def test_worker_over_max_memory_is_recycled
    server = start_server(["-l", "127.0.0.1:0", "--max-memory-per-child", "1024"]) # 1 MiB: always over
    first = server.worker_pids.first
    Timeout.timeout(15) { sleep 0.1 until (server.worker_pids - [first]).any? }
    assert_match(/worker 0 \(pid #{first}\) stopping: USS \d+ KiB is over max_memory_per_child \(1024 KiB\)/, server.log)
    io = server.tcp
    assert_equal 200, request(io, "GET", "/").status, "requests are still served while workers recycle"
  ensure
    io&.close
  end

  # What /proc says a worker maps, KiB: its RSS and USS (Private_Clean + Private_Dirty).
  def rss_and_uss(pid)
    rollup = File.read("/proc/#{pid}/smaps_rollup")
    kib = ->(field) { rollup[/^#{field}:\s*(\d+)/, 1].to_i }
    [kib.call("Rss"), kib.call("Private_Clean") + kib.call("Private_Dirty")]
  end

  def pid_of(res) = Integer(res.body[/pid=(\d+)/, 1])

  def get(server, path)
    io = server.tcp
    request(io, "GET", path)
  ensure
    io&.close
  end

  # A worker over the limit by RSS only because it shares the master's pages costs little: it is
  # never recycled. (By RSS, as before, it was recycled after its first request.)
  def test_a_worker_that_only_shares_pages_is_never_recycled
    skip "no /proc/self/smaps_rollup (Linux < 4.14)" unless File.readable?("/proc/self/smaps_rollup")
    server = start_server(["-l", "127.0.0.1:0", "--max-memory-per-child", SHARED_LIMIT.to_s], app: "shared_heap.ru")
    worker = server.worker_pids.first
    200.times do |i|
      res = get(server, "/")
      assert_equal 200, res.status
      assert_equal worker, pid_of(res), "request #{i + 1} went to another worker:\n#{server.log}"
    end
    rss, uss = rss_and_uss(worker)
    assert_operator rss, :>, SHARED_LIMIT, "the premise: the worker is over the limit by RSS"
    assert_operator uss, :<, SHARED_LIMIT, "the premise: the worker is under the limit by USS"
    refute_match(/over max_memory_per_child/, server.log)
    assert_equal [worker], server.worker_pids
    assert_match(/max_memory_per_child #{SHARED_LIMIT} KiB of USS/, server.log, "the master says what is counted")
  end

  # The same app leaking 1 MiB a request: its USS grows, and passes the limit after about as many
  # requests as the room USS had left (in MiB); the stop line names USS.
  def test_a_worker_that_leaks_is_recycled_by_uss
    skip "no /proc/self/smaps_rollup (Linux < 4.14)" unless File.readable?("/proc/self/smaps_rollup")
    server = start_server(["-l", "127.0.0.1:0", "--max-memory-per-child", SHARED_LIMIT.to_s], app: "shared_heap.ru")
    worker = server.worker_pids.first
    _, uss = rss_and_uss(worker)
    room = (SHARED_LIMIT - uss) / 1024 # requests of 1 MiB before it is over
    leaks = 0
    wait_for(60, "the leaking worker recycled") do
      leaks += 1 if pid_of(get(server, "/?leak=1024")) == worker
      (server.worker_pids - [worker]).any?
    end
    assert_match(/worker 0 \(pid #{worker}\) stopping: USS \d+ KiB is over max_memory_per_child \(#{SHARED_LIMIT} KiB\)/,
                 server.log)
    over = Integer(server.log[/\(pid #{worker}\) stopping: USS (\d+) KiB/, 1])
    assert_operator over, :>, SHARED_LIMIT
    assert_operator leaks, :>=, room / 2, "recycled after #{leaks} leaks of 1 MiB; USS had room for #{room}"
    wait_for(60, "the worker's exit line") { server.log[/\(pid #{worker}\) exiting after \d+ requests \(peak RSS \d+ KiB\)/] }
    assert_equal 200, get(server, "/").status, "a fresh worker serves"
  end
end

class OobGCTest < ServerTest
  def gc_delta(args)
    server = start_server(["-l", "127.0.0.1:0", *args], app: "kitchen.ru")
    io = server.tcp
    # 20 ms gaps: OobGC only runs when no request is waiting, so back-to-back requests defer it
    counts = Array.new(11) { Integer(request(io, "GET", "/gc-count").body).tap { sleep 0.02 } }
    counts.last - counts.first
  ensure
    io&.close
  end

  def gcs_inside_requests(args)
    server = start_server(["-l", "127.0.0.1:0", *args], app: "gc_churn.ru")
    io = server.tcp
    Array.new(60) { Integer(request(io, "GET", "/").body).tap { sleep 0.01 } }.sum
  ensure
    io&.close
  end

  def test_oob_gc_auto_moves_gcs_out_of_requests
    without = gcs_inside_requests([])
    with = gcs_inside_requests(["--oob-gc-auto"])
    assert_operator without, :>=, 20, "control: this app needs GCs while it runs"
    assert_operator with * 4, :<, without, "with --oob-gc-auto most GCs run between requests (#{with} vs #{without})"
  end

  def test_oob_gc_runs_between_requests
    with = gc_delta(["--oob-gc", "1"])
    without = gc_delta([])
    assert_operator with, :>=, 8, "a GC between each of 10 requests"
    assert_operator without, :<, 8, "control: 10 tiny requests alone do not cause that many GCs"
  end
end

# sched_batch (off by default): with --sched-batch workers are SCHED_BATCH tasks (policy 3 in
# /proc/PID/stat, field 41) and the master stays a normal task; by default every process is normal (0).
class SchedBatchTest < ServerTest
  SCHED_OTHER = 0
  SCHED_BATCH = 3

  def policy(pid) = Integer(File.read("/proc/#{pid}/stat").split(") ").last.split[38])

  def test_sched_batch_makes_workers_batch_tasks_and_not_the_master
    skip "no /proc here" unless File.exist?("/proc/self/stat")
    server = start_server(["-l", "127.0.0.1:0", "--sched-batch"], workers: 2)
    assert_equal [SCHED_BATCH, SCHED_BATCH], server.worker_pids.map { |p| policy(p) }
    assert_equal SCHED_OTHER, policy(server.pid)
    # and they serve as usual
    assert_equal 200, request(server.tcp, "GET", "/").status
  end

  def test_workers_are_normal_tasks_by_default
    skip "no /proc here" unless File.exist?("/proc/self/stat")
    server = start_server(["-l", "127.0.0.1:0"], workers: 1)
    assert_equal [SCHED_OTHER], server.worker_pids.map { |p| policy(p) }
  end
end
