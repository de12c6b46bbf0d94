# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "open3"

# The status listener (--stats-listen): GET /status, GET /metrics, and `blackbuck status`.
class StatusTest < ServerTest
  def start_with_status(workers: 2)
    dir = Dir.mktmpdir("bb-test")
    @stats = "#{dir}/status.sock"
    server = start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{@stats}"],
                          dir: dir, app: "kitchen.ru", workers: workers)
    assert_match(/status listening on unix:#{Regexp.escape(@stats)}/, server.log)
    server
  end

  # One request to the status listener; [status code, body].
  def stats_get(path)
    io = UNIXSocket.new(@stats)
    io.write("GET #{path} HTTP/1.1\r\nHost: x\r\n\r\n")
    res = read_response(io)
    [res.status, res.body]
  ensure
    io&.close
  end

  def status = JSON.parse(stats_get("/status").tap { |code, _| assert_equal 200, code }[1])

  # Every sample's family has # HELP and # TYPE lines before it. Returns {family => {labels => value}}.
  def parse_prometheus(text)
    helped = {}
    typed = {}
    samples = Hash.new { |h, k| h[k] = {} }
    text.each_line(chomp: true) do |line|
      case line
      when /\A# HELP (\w+) \S/ then helped[Regexp.last_match(1)] = true
      when /\A# TYPE (\w+) (counter|gauge|histogram|summary|untyped)\z/ then typed[Regexp.last_match(1)] = true
      when /\A(\w+)(\{[^}]*\})? (-?[\d.]+(?:e[+-]?\d+)?)\z/
        name, labels, value = Regexp.last_match.captures
        assert helped[name], "#{name}: sample before its # HELP line"
        assert typed[name], "#{name}: sample before its # TYPE line"
        samples[name][labels.to_s] = Float(value)
      else
        flunk "not Prometheus text: #{line.inspect}"
      end
    end
    samples
  end

  def test_status_and_metrics_show_the_request_in_flight
    server = start_with_status(workers: 2)
    busy = server.unix
    busy.write("GET /sleep?t=2 HTTP/1.1\r\nHost: x\r\n\r\n")
    snap = wait_for { (s = status)["totals"]["busy"] == 1 && s }

    assert_equal server.pid, snap["pid"]
    assert_equal Blackbuck::VERSION, snap["version"] if defined?(Blackbuck::VERSION)
    assert_equal 2, snap["workers"].size
    assert_equal server.worker_pids.sort, snap["workers"].map { |w| w["pid"] }.sort
    worker = snap["workers"].find { |w| w["state"] == "busy" }
    assert_equal "GET", worker["method"]
    assert_equal "/sleep", worker["path"]
    assert_operator worker["running_ms"], :>, 0
    assert_kind_of Integer, worker["heartbeat_age_ms"]
    other = (snap["workers"] - [worker]).first
    assert_equal "idle", other["state"]
    assert_nil other["path"]
    assert_equal 2, snap["listeners"].size
    snap["listeners"].each do |l|
      assert_kind_of Integer, l["queued"], "#{l['name']}: queue depth known on Linux"
      assert_operator l["backlog"], :>, 0
    end
    assert_equal({ "workers" => 2, "busy" => 1, "idle" => 1 }, snap["totals"].slice("workers", "busy", "idle"))

    code, text = stats_get("/metrics")
    assert_equal 200, code
    m = parse_prometheus(text)
    assert_equal 2.0, m["blackbuck_workers"][""]
    assert_equal 1.0, m["blackbuck_workers_busy"][""]
    assert_equal 2, m["blackbuck_requests_total"].size, "one requests counter per worker"
    assert m.key?("blackbuck_connections")
    assert_equal 2, m["blackbuck_listen_queue"].size
    assert_equal 2, m["blackbuck_listen_backlog"].size
    assert_match(/blackbuck_listen_queue\{listener="unix:/, text)
    assert_match(/^# TYPE blackbuck_requests_total counter$/, text)

    res = read_response(busy)
    assert_equal "slept\n", res.body, "the app's request was not disturbed"
    wait_for { status["totals"]["requests"] >= 1 }
  ensure
    busy&.close
  end

  def test_unknown_paths_are_404_and_the_app_is_not_on_the_status_listener
    start_with_status(workers: 1)
    assert_equal 404, stats_get("/hello")[0]
    assert_equal 404, stats_get("/")[0]
  end

  def test_listen_queue_depth_counts_waiting_connections
    server = start_with_status(workers: 1)
    busy = server.unix
    busy.write("GET /sleep?t=3 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for { status["totals"]["busy"] == 1 }
    # The only worker is in the app: new connections wait in the kernel's accept queues.
    waiting = Array.new(3) { server.unix }
    # TCP_DEFER_ACCEPT: a TCP connection is queued only once it has sent data.
    waiting += Array.new(2) { server.tcp.tap { |s| s.write("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n") } }
    snap = wait_for { (s = status)["totals"]["queued"] >= 5 && s }
    by_name = snap["listeners"].to_h { |l| [l["name"][/\A\w+/], l] }
    assert_equal 3, by_name["unix"]["queued"]
    assert_equal 2, by_name["http"]["queued"]
    m = parse_prometheus(stats_get("/metrics")[1])
    assert_equal 5.0, m["blackbuck_listen_queue"].values.sum

    waiting.each_with_index do |io, i|
      io.write("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n") if i < 3
      assert_equal 200, read_response(io).status, "queued connections are served once the worker is free"
    end
    wait_for { status["totals"]["queued"].zero? }
  ensure
    busy&.close
    waiting&.each(&:close)
  end

  def test_status_command_prints_a_table_and_json
    server = start_with_status(workers: 2)
    busy = server.tcp
    busy.write("GET /sleep?t=2 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for { status["totals"]["busy"] == 1 }

    out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status", "unix:#{@stats}")
    assert st.success?, err
    assert_match(/master pid #{server.pid}/, out)
    assert_match(/workers 2 \(busy 1, idle 1\)/, out)
    assert_match(/^WORKER\s+PID\s+STATE\s+REQUESTS\s+CONNS\s+CURRENT\s+RUNNING/, out)
    assert_match(%r{^\d+\s+\d+\s+busy\s+\d+\s+\d+\s+GET /sleep\s+\d+\.\d{3}s}, out)
    assert_match(/^\d+\s+\d+\s+idle\s/, out)
    assert_match(/^LISTENER\s+QUEUED\s+BACKLOG$/, out)
    assert_match(%r{^http://127\.0\.0\.1:\d+\s+\d+\s+\d+$}, out)

    out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status", "--json", "unix:#{@stats}")
    assert st.success?, err
    assert_equal server.pid, JSON.parse(out)["pid"]
  ensure
    busy&.close
  end

  def test_status_command_on_an_unreachable_address_exits_1_with_one_line
    dir = Dir.mktmpdir("bb-test")
    [["unix:#{dir}/nobody.sock"], ["127.0.0.1:1"]].each do |args|
      out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status", *args)
      assert_equal 1, st.exitstatus, err
      assert_equal "", out
      assert_equal 1, err.lines.size, err
      assert_match(/\Ablackbuck status: cannot read status from #{Regexp.escape(args.first)}: /, err)
    end
    _out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status")
    assert_equal 2, st.exitstatus
    assert_match(/want exactly one ADDR/, err)
  ensure
    FileUtils.rm_rf(dir)
  end

  def test_a_slow_status_client_does_not_stall_the_master
    server = start_with_status(workers: 1)
    silent = UNIXSocket.new(@stats) # connects and never sends
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_equal 200, stats_get("/status")[0]
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - t, :<, 2
    assert_equal 200, request(server.tcp, "GET", "/hello").status
    assert closed_by_peer?(silent), "the master gave up on the silent client"
  ensure
    silent&.close
  end

  def test_listen_queue_is_nil_for_what_is_not_a_listener
    require "blackbuck"
    r, w = IO.pipe
    client = Socket.new(:INET, :STREAM)
    assert_nil Blackbuck::Native.listen_queue(r.fileno)
    assert_nil Blackbuck::Native.listen_queue(client.fileno), "a TCP socket that does not listen"
    assert_nil Blackbuck::Native.listen_queue(UNIXSocket.pair[0].fileno), "a UNIX socket that does not listen"
    assert_nil Blackbuck::Native.listen_queue(999_999), "a closed descriptor"
    server = TCPServer.new("127.0.0.1", 0)
    server.listen(7)
    assert_equal [0, 7], Blackbuck::Native.listen_queue(server.fileno)
  ensure
    [r, w, client, server].each { |io| io&.close }
  end

  def test_workers_do_not_hold_the_status_socket_and_term_removes_it
    server = start_with_status(workers: 1)
    wpid = server.worker_pids.first
    # /proc/net/unix: "Num RefCount Protocol Flags Type St Inode Path"; the socket's inode, not the file's.
    inode = File.read("/proc/net/unix").lines.map(&:split).find { |f| f[7] == @stats }&.fetch(6)
    refute_nil inode
    fds = Dir.glob("/proc/#{wpid}/fd/*").map { |f| File.readlink(f) rescue nil } # rubocop:disable Style/RescueModifier
    refute_empty fds
    refute_includes fds, "socket:[#{inode}]", "the worker closed the status listener after fork"
    server.signal(:TERM)
    assert server.wait_exit(15)&.success?
    refute File.exist?(@stats), "the status socket file is removed on shutdown"
  end
end
