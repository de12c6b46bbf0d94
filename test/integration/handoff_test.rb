# frozen_string_literal: true

require_relative "../test_helper"

# handoff_after (Native::Handoff): a request that arrives on a keep-alive connection of a worker
# whose app is busy with a slow request is served by a free worker, not held hostage; the connection
# keeps its state (client address, requests served) and stays open; nothing is lost or served twice
# when the server stops while a moved connection waits for a worker; no descriptor leaks.
# Also run against the poll(2) poller (rake test:poll).
class HandoffTest < ServerTest
  include HandoffHelpers

  SLOW = 1.5 # seconds the slow request runs in the control (handoff_after 0), which waits for it

  # Two workers with a status listener: the tests see through it when a worker runs its app, and
  # what the moves were. A slow request is held in the app by a gate (handoff.ru ?gate=NAME) that
  # the test opens once it has seen what it asserts: never a guessed time.
  def start_handoff(args = [])
    @gates = Dir.mktmpdir("bb-gates")
    start_both(args, stats: true, app: "handoff.ru", workers: 2, env: { "BB_GATE_DIR" => @gates })
  end

  def open_gate(name) = File.write(File.join(@gates, name), "")

  def teardown
    %w[slow held].each { |g| open_gate(g) } if @gates # a failed test leaves nothing held in the app
    super
  end


  # Bytes waiting on the server's hand-off socket (the SOCK_SEQPACKET pair its master made, which its
  # workers inherit): a moved connection waits there until a worker takes it. From ss(8), which
  # shows every UNIX socket's receive queue and the processes that hold it.
  def handoff_queued(server)
    IO.popen(["ss", "-x", "-a", "-p"], &:read).lines.sum do |l|
      l.start_with?("u_seq") && l.include?("pid=#{server.pid},") ? Integer(l.split[2]) : 0
    end
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # The hostage scenario: a slow request on a, held in the app until the fast one on b (same
  # worker) is answered, and only then let go. Returns [the pid that answered b, the slow
  # worker's pid, a, b].
  def hostage(server, transport)
    a, b, pid = same_worker_pair(-> { transport == :unix ? server.unix : server.tcp })
    send_get(a, "/?gate=slow")
    wait_until_in_app(stats_path(server), pid) # so a request on b now waits behind it (or moves)
    res = get(b, "/fast") # answered while the slow one is held: it did not wait behind it
    assert_nil a.wait_readable(0), "the slow request is still in the app"
    open_gate("slow")
    slow = read_response(a, timeout: 30)
    assert_equal 200, slow&.status, "the slow request is answered too"
    assert_equal pid, served_by(slow)
    [served_by(res), pid, a, b]
  end

  def test_a_waiting_request_moves_to_a_free_worker_over_tcp
    server = start_handoff
    by, slow_pid, a, b = hostage(server, :tcp)
    refute_equal slow_pid, by, "the other worker answered it"
    # The connection lives on in its new worker: keep-alive, the same socket.
    assert_equal by, served_by(get(b, "/again"))
    assert_equal slow_pid, served_by(get(a, "/"))
  ensure
    [a, b].each { |io| io&.close }
  end

  def test_a_waiting_request_moves_to_a_free_worker_over_unix
    server = start_handoff
    by, slow_pid, a, b = hostage(server, :unix)
    refute_equal slow_pid, by
    assert_equal by, served_by(get(b, "/again"))
  ensure
    [a, b].each { |io| io&.close }
  end

  # The control: with the watcher off, the same request waits for the slow one (the old behaviour):
  # the slow worker answers it, after its slow request. (A lower bound on the wait: a loaded machine
  # only makes it longer.)
  def test_without_handoff_the_request_waits_for_the_slow_one
    server = start_handoff(["--handoff-after", "0"])
    a, b, pid = same_worker_pair(-> { server.tcp })
    send_get(a, "/?sleep=#{SLOW}")
    wait_until_in_app(stats_path(server), pid)
    t = now
    res = get(b, "/fast")
    waited = now - t
    assert_equal 200, read_response(a, timeout: 30)&.status
    assert_operator waited, :>, SLOW - 0.5, "with handoff_after 0 nothing moves"
    assert_equal pid, served_by(res)
  ensure
    [a, b].each { |io| io&.close }
  end

  # A PROXY protocol client address and the keep-alive request count travel with the connection.
  def test_a_moved_connection_keeps_its_client_address_and_request_count
    dir = Dir.mktmpdir("bb-test")
    @gates = Dir.mktmpdir("bb-gates")
    server = start_server(["-l", "127.0.0.1:0", "--proxy-protocol", "--max-keepalive-requests", "3",
                           "--stats-listen", "unix:#{dir}/status.sock"], dir: dir, app: "handoff.ru", workers: 2,
                                                                        env: { "BB_GATE_DIR" => @gates })
    n = 0
    open = lambda do
      s = server.tcp
      s.write("PROXY TCP4 203.0.113.#{n += 1} 127.0.0.1 40000 80\r\n")
      s
    end
    a, b, pid = same_worker_pair(open)
    addr = get(b, "/").body[/addr=(\S+)/, 1] # b's second request, still on the first worker
    assert_match(/\A203\.0\.113\.\d+\z/, addr)
    send_get(a, "/?gate=slow")
    wait_until_in_app(stats_path(server), pid)
    res = get(b, "/third") # its third: moved, and the last max_keepalive_requests allows
    refute_equal pid, served_by(res), "the request moved"
    assert_equal addr, res.body[/addr=(\S+)/, 1], "REMOTE_ADDR from the PROXY header survives the move"
    assert_equal "close", res.headers["connection"], "the count went on: the 3rd request is the last"
    assert closed_by_peer?(b)
    open_gate("slow")
    assert_equal 200, read_response(a, timeout: 30)&.status
  ensure
    [a, b].each { |io| io&.close }
  end

  # Moves show in /status (per worker and in total) and /metrics; no descriptor stays behind.
  def test_moves_are_counted_and_leave_no_descriptor_behind
    server = start_handoff
    stats = stats_path(server)
    pids = server.worker_pids
    baseline = pids.to_h { |p| [p, socket_fds(p)] }
    by, slow_pid, a, b = hostage(server, :tcp)
    refute_equal slow_pid, by
    # Both moves are over (the slow answer came after them); a worker publishes its counts on its
    # tick, so the counts are read once both have ticked since.
    status = status_after(stats, now)
    workers = status["workers"].to_h { |w| [w["pid"], w] }
    seen = "workers: #{status['workers'].map { |w| w.slice('pid', 'moved_out', 'moved_in') }}"
    assert_equal [1, 0], workers[slow_pid].values_at("moved_out", "moved_in"), "the slow worker moved one out; #{seen}"
    assert_equal [0, 1], workers[by].values_at("moved_out", "moved_in"), "the other took it in; #{seen}"
    assert_equal 1, status["totals"]["moved"]
    assert_equal 1, status["recent"]["moved"]
    refute_nil workers[by]["queue_time"]["p99"], "the moved request's queue time is counted where it ran"
    metrics = stats_get(stats, "/metrics")
    assert_match(/^blackbuck_connections_moved_total 1$/, metrics)
    assert_match(/^blackbuck_worker_queue_seconds\{worker="\d",quantile="0.99"\} [\d.]+$/, metrics)
    [a, b].each(&:close)
    wait_for { pids.all? { |p| socket_fds(p) == baseline[p] } }
  ensure
    [a, b].each { |io| io&.close unless io&.closed? }
  end

  # Both workers are busy, so the moved connection waits on the hand-off socket when TERM comes:
  # it is still served (then closed with the rest), and every request is answered once.
  def test_term_while_a_moved_connection_waits_for_a_worker
    server = start_handoff
    a1, b, = same_worker_pair(-> { server.tcp })
    send_get(a1, "/?gate=held")
    wait_until_in_app(stats_path(server)) # (a1's worker, or the other: see below)
    a2 = server.tcp # the other worker accepts it (the first is in its app)
    send_get(a2, "/?gate=held")
    wait_for(15, "both workers in their apps") do
      status_json(stats_path(server))["workers"].all? { |w| w["state"] == "busy" }
    end
    send_get(b, "/waiting")
    wait_for(15, "b moved to the hand-off socket") { handoff_queued(server).positive? } # no worker is free to take it
    server.signal(:TERM)
    wait_for { server.log.include?("TERM: stopping gracefully") }
    open_gate("held") # both held requests end only once the stop has begun
    r1 = read_response(a1, timeout: 30)
    r2 = read_response(a2, timeout: 30)
    rb = read_response(b, timeout: 30)
    assert_equal [200, 200, 200], [r1&.status, r2&.status, rb&.status]
    # a1's request may run on the other worker: its own is still "in the app" (request_done comes
    # after the probe's answer went out) when it arrives, and on a loaded CPU that can last past
    # handoff_after (2 ms), so the watcher moves a1 on. Either way the two held requests hold both.
    refute_equal served_by(r1), served_by(r2), "the two held requests ran on the two workers"
    assert closed_by_peer?(b), "the stopping server closes it after its answer"
    assert_equal 0, server.wait_exit(30)&.exitstatus
  ensure
    [a1, a2, b].each { |io| io&.close }
  end

  # Under load with recycling workers, every request is answered exactly once, and by its own answer:
  # six keep-alive clients send 50 numbered requests each (one in four waits 30 ms, so connections
  # move), reconnecting when a recycled worker closes theirs; a request whose connection closed
  # before any answer is sent again (it reached no app: a worker closes only idle connections).
  # Then the server's count of requests served equals the answers, and each answer echoes its id.
  def test_every_request_is_served_once_under_load_with_recycling
    server = start_handoff(["--max-requests-per-child", "40", "--min-requests-per-child", "20"])
    clients, per_client = 6, 50
    results = numbered_requests(server, clients: clients, per_client: per_client, slow_every: 4)
    finished = now # every client has its answers and has closed its connection
    assert_equal clients * per_client, results.size
    results.each { |id, status, echoed| assert_equal [200, id], [status, echoed], "the answer to #{id}" }
    served = settled_status(stats_path(server), finished)["totals"] # a request served twice is counted by then
    assert_equal results.size, served["requests"], "requests served by the server vs answers the clients got"
    assert_operator served["moved"], :>, 0, "connections moved while the 30 ms requests ran"
    assert_operator server.log.scan(/worker \d+ \(pid \d+\) ready/).size, :>, 2, "workers were recycled"
  end
end
