# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "digest"
require "open3"
require_relative "../apps/gate_wait"

# --threads N: N app threads per worker (AppPool). Requests overlap with N > 1 and never with the
# default 1; rack.multithread says which. The loop thread keeps every connection: bodies spilled
# to a tempfile, streaming, hijack, early hints, the request timeout and a graceful stop work from
# an app thread; a request waiting on a worker whose threads are all busy moves to a free worker.
class ThreadsTest < ServerTest
  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Sends GET path on n fresh connections at once; [seconds until all answered, responses].
  def concurrent_gets(server, path, n)
    ios = Array.new(n) { server.tcp }
    t = now
    ios.each { |io| io.write("GET #{path} HTTP/1.1\r\nHost: x\r\n\r\n") }
    responses = ios.map { |io| read_response(io, timeout: 10) }
    [now - t, responses]
  ensure
    ios&.each(&:close)
  end

  # The app notes how many requests it runs at once: each answer says 2, so the second began before
  # the first had ended (a wall-clock bound would say the same until the machine is busy).
  def test_two_threads_overlap_two_sleeps_and_say_multithread
    server = start_both(["--threads", "2"], app: "kitchen.ru", workers: 1)
    _took, (a, b) = concurrent_gets(server, "/overlap?t=0.2", 2)
    assert_equal [200, 200], [a&.status, b&.status]
    [a, b].each { |r| assert_match(/max=2 multithread=true/, r.body, "2 x 200 ms on one worker with 2 threads") }
  end

  def test_one_thread_never_overlaps
    server = start_both([], app: "kitchen.ru", workers: 1)
    took, responses = concurrent_gets(server, "/overlap?t=0.1", 3)
    assert_equal [200] * 3, responses.map { |r| r&.status }
    responses.each { |r| assert_match(/max=1 multithread=false/, r.body) }
    assert_operator took, :>=, 0.3, "three 100 ms requests one after another"
  end

  def test_bodies_streams_hints_and_hijack_from_app_threads
    server = start_both(["--threads", "3", "--early-hints"], app: "kitchen.ru", workers: 1)
    body = Random.new(7).bytes(300 * 1024) # past body_buffer: a tempfile, closed by the loop afterwards
    threads = Array.new(3) do
      Thread.new do
        io = server.unix
        res = request(io, "POST", "/echo", body: body)
        [res.status, res["x-input-class"], res["x-sha256"]]
      ensure
        io&.close
      end
    end
    threads.map(&:value).each do |status, klass, sha|
      assert_equal 200, status
      assert_equal "Tempfile", klass
      assert_equal Digest::SHA256.hexdigest(body), sha
    end
    io = server.tcp
    assert_equal "s" * (4 * 65_536), request(io, "GET", "/stream-big?n=#{4 * 65_536}").body
    io.write("GET /early HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 103, read_response(io).status
    assert_equal "after hints", read_response(io).body
    assert_equal 200, request(io, "GET", "/hello").status, "keep-alive after answers from app threads"
    hijacked = server.tcp
    res = request(hijacked, "GET", "/hijack")
    assert_equal "hijacked", res.body
    assert_equal 200, request(io, "GET", "/hello").status, "the worker goes on after a hijack"
    assert_operator fd_links(server.worker_pids.first).count { |l| l.start_with?("socket:") }, :<, 12
  ensure
    io&.close
    hijacked&.close
  end

  # The master's timeout notice reaches the thread running the oldest request; the other thread's
  # request is answered, and the worker is replaced once it has drained.
  def test_request_timeout_in_an_app_thread
    server = start_both(["--timeout", "1", "--threads", "2"], stats: true, app: "kitchen.ru")
    old = server.worker_pids.first
    stuck = server.tcp
    stuck.write("GET /sleep?t=30 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app(stats_path(server)) # the oldest request
    other = server.tcp
    assert_equal "slept\n", request(other, "GET", "/sleep?t=0.3").body, "the second thread serves meanwhile"
    res = read_response(stuck, timeout: 15)
    assert_equal 503, res&.status
    assert_logged(server, %r{request timeout \(1s\): GET /sleep: Blackbuck::RequestTimeout})
    wait_for { (server.worker_pids - [old]).any? }
  ensure
    stuck&.close
    other&.close
  end

  # TERM while both threads run a request: both are answered, then the server exits 0.
  def test_term_waits_for_requests_in_app_threads
    server = start_both(["--threads", "2"], stats: true, app: "kitchen.ru", workers: 1)
    ios = Array.new(2) { server.tcp }
    ios.each { |io| io.write("GET /sleep?t=2 HTTP/1.1\r\nHost: x\r\n\r\n") }
    wait_for(15, "both requests taken and running") do # (read as they are accepted, then on the app threads)
      status_json(stats_path(server))["workers"].any? { |w| w["connections"] == 2 && w["state"] == "busy" }
    end
    server.signal(:TERM)
    assert_equal [200, 200], ios.map { |io| read_response(io, timeout: 10)&.status }
    assert_equal 0, server.wait_exit(15)&.exitstatus
  ensure
    ios&.each(&:close)
  end

  # Both threads of one worker run slow requests (held at a gate until the test opens it); a fast
  # request on a third connection of that worker is answered by the other worker meanwhile.
  def test_a_request_on_a_full_worker_moves_to_a_free_one
    gates = Dir.mktmpdir("bb-gates")
    server = start_both(["--threads", "2"], app: "handoff.ru", workers: 2, env: { "BB_GATE_DIR" => gates })
    conns = Array.new(10) { server.unix }
    pids = conns.map { |c| Integer(request(c, "GET", "/").body[/pid=(\d+)/, 1]) }
    pid, = pids.tally.max_by { |_, n| n }
    mine = conns.each_index.select { |i| pids[i] == pid }
    assert_operator mine.size, :>=, 3, "ten connections, two workers: #{pids.inspect}"
    a, b, c = mine.first(3).map { |i| conns[i] }
    [a, b].each { |io| io.write("GET /?gate=slow HTTP/1.1\r\nHost: x\r\n\r\n") }
    wait_for(30, "both slow requests in the app") { GateWait.waiting(gates, "slow") == 2 }
    res = request(c, "GET", "/fast")
    refute_equal pid, Integer(res.body[/pid=(\d+)/, 1]), "another worker answered it, the slow ones still held"
    assert_equal 200, request(c, "GET", "/").status, "the moved connection stays open"
    File.write(File.join(gates, "slow"), "")
    [a, b].each { |io| assert_equal 200, read_response(io, timeout: 30)&.status }
  ensure
    File.write(File.join(gates, "slow"), "") if gates
    conns&.each(&:close)
  end

  # Requests that typically run 1 s: a fast request arriving while both threads of a worker run
  # younger ones waits in that worker's queue for the next free thread (Worker#full?). The other
  # worker has free threads, so once it has waited handoff_after it moves there, already read and
  # parsed: its bytes travel with the connection, and the other worker answers it while the slow ones
  # are still held. The connection stays open there; /status counts the move. (The typical time is
  # the worker's own measure; 1 s leaves a loaded machine room to start both before they are older.)
  def test_a_queued_request_moves_with_its_bytes_to_a_free_worker
    dir = Dir.mktmpdir("bb-test")
    gates = Dir.mktmpdir("bb-gates")
    stats = "#{dir}/status.sock"
    server = start_server(["-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{stats}", "--threads", "2",
                           "--handoff-after", "0.05"], dir: dir, app: "handoff.ru", workers: 2,
                                                       env: { "BB_GATE_DIR" => gates })
    conns = Array.new(10) { server.unix }
    # every worker's typical request: 1 s
    conns.each { |c| c.write("GET /?sleep=1 HTTP/1.1\r\nHost: x\r\n\r\n") }
    pids = conns.map { |c| Integer(read_response(c, timeout: 10).body[/pid=(\d+)/, 1]) }
    pid, = pids.tally.max_by { |_, n| n }
    mine = conns.each_index.select { |i| pids[i] == pid }
    assert_operator mine.size, :>=, 3, "ten connections, two workers: #{pids.inspect}"
    a, b, c = mine.first(3).map { |i| conns[i] }
    [a, b].each { |io| io.write("GET /?gate=slow HTTP/1.1\r\nHost: x\r\n\r\n") }
    # both run, younger than the typical 1 s: room for one more in the queue
    wait_for(30, "both slow requests in the app") { GateWait.waiting(gates, "slow") == 2 }
    res = request(c, "GET", "/fast")
    refute_equal pid, Integer(res.body[/pid=(\d+)/, 1]), "another worker answered it, the slow ones still held"
    queued = Float(res.body[/queue=([\d.]+)/, 1])
    assert_operator queued, :>=, 0.05, "it waited handoff_after in the first worker's queue, then moved"
    assert_equal 200, request(c, "GET", "/").status, "the moved connection stays open"
    File.write(File.join(gates, "slow"), "")
    [a, b].each { |io| assert_equal 200, read_response(io, timeout: 30)&.status }
    # (a worker publishes its move counts on its tick)
    wait_for(15, "the move counted in /status") do
      JSON.parse(stats_get(stats, "/status"))["workers"].find { |w| w["pid"] == pid }["moved_out"] >= 1
    end
  ensure
    File.write(File.join(gates, "slow"), "") if gates
    conns&.each(&:close)
  end

  def test_every_request_is_served_once_with_threads_and_recycling
    dir = Dir.mktmpdir("bb-test")
    stats = "#{dir}/status.sock"
    server = start_server(["-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{stats}", "--threads", "3",
                           "--max-requests-per-child", "40", "--min-requests-per-child", "20"],
                          dir: dir, app: "handoff.ru", workers: 2)
    results = numbered_requests(server, clients: 8, per_client: 30, slow_every: 3)
    finished = now # every client has its answers and has closed its connection
    assert_equal 240, results.size
    results.each { |id, status, echoed| assert_equal [200, id], [status, echoed], "the answer to #{id}" }
    totals = settled_status(stats, finished)["totals"] # a request served twice is counted by then
    assert_equal results.size, totals["requests"], "requests served vs answers"
    assert_operator server.log.scan(/worker \d+ \(pid \d+\) ready/).size, :>, 2, "workers were recycled"
  end

  def test_threads_must_be_a_positive_count
    out, status = Open3.capture2e(RbConfig.ruby, EXE, "--threads", "0", "--check", File.join(APPS, "kitchen.ru"))
    refute status.success?
    assert_match(/threads/, out)
  end
end
