# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "open3"

# The status listener (--stats-listen): GET /status, GET /metrics, and `blackbuck status`.
class StatusTest < ServerTest
  def start_with_status(*args, workers: 2, app: "kitchen.ru", env: {})
    dir = Dir.mktmpdir("bb-test")
    @stats = "#{dir}/status.sock"
    server = start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{@stats}",
                           *args], dir: dir, app: app, workers: workers, env: env)
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
      when /\A# TYPE (\w+) (counter|gauge|histogram|summary|untyped)\z/ then typed[Regexp.last_match(1)] = Regexp.last_match(2)
      when /\A(\w+)(\{[^}]*\})? (-?[\d.]+(?:e[+-]?\d+)?)\z/
        name, labels, value = Regexp.last_match.captures
        family = name.sub(/_(bucket|sum|count)\z/, "")
        family = name unless typed[family] == "histogram" # a histogram's samples carry these suffixes
        assert helped[family], "#{name}: sample before its # HELP line"
        assert typed[family], "#{name}: sample before its # TYPE line"
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

  # Issue 32, item 10: /metrics has what /status has (memory per role, refork generation, worker exits
  # by why, build info), from the same snapshot, and the percentiles never exceed the slowest request.
  def test_metrics_carry_memory_generation_exits_and_build_info_as_status_does
    server = start_with_status("--max-requests-per-child", "1", workers: 2)
    2.times { |i| assert_equal 200, fresh_get(server).status, "request #{i + 1}" }
    wait_for { status["worker_exits"]["recycle"] == 2 } # a worker recycles after each request
    victim = status["workers"].first["pid"]
    Process.kill(:KILL, victim)
    wait_for { status["worker_exits"]["crash"] == 1 }
    wait_for { status["workers"].count { |w| w["state"] == "idle" } == 2 }
    Process.kill(:TTOU, server.pid)
    snap = wait_for { (s = status)["worker_exits"]["ttou"] == 1 && s["workers"].size == 1 && s }

    assert_equal({ "crash" => 1, "timeout" => 0, "recycle" => 2, "memory" => 0, "ttou" => 1, "refork" => 0,
                   "unsafe" => 0, "other" => 0 }, snap["worker_exits"])
    m = parse_prometheus(stats_get("/metrics")[1])
    assert_equal({ '{reason="crash"}' => 1.0, '{reason="timeout"}' => 0.0, '{reason="recycle"}' => 2.0,
                   '{reason="memory"}' => 0.0, '{reason="ttou"}' => 1.0, '{reason="refork"}' => 0.0,
                   '{reason="unsafe"}' => 0.0, '{reason="other"}' => 0.0 }, m["blackbuck_worker_exits_total"])
    assert_equal({ %({version="#{snap['version']}",ruby="#{snap['ruby']}"}) => 1.0 }, m["blackbuck_build_info"])
    assert_equal RUBY_VERSION, snap["ruby"]
    assert_equal({ "" => 0.0 }, m["blackbuck_refork_generation"])
    assert_equal 0, snap["refork"]["generation"]
    %w[uss pss].each do |kind|
      samples = m["blackbuck_memory_#{kind}_bytes"]
      assert_equal ['{role="master"}', '{role="worker"}'], samples.keys.sort, kind
      samples.each { |role, bytes| assert_operator bytes, :>, 1024 * 1024, "#{kind} #{role}: a Ruby process has MiBs" }
    end
    text = stats_get("/metrics")[1]
    assert_match(/^# TYPE blackbuck_worker_exits_total counter$/, text)
    assert_match(/^# TYPE blackbuck_memory_uss_bytes gauge$/, text)
  end

  # A worker whose request ran past --timeout retires after the 503 (or is killed): a timeout, in
  # /status and /metrics, not a crash or a recycle.
  def test_a_worker_replaced_after_a_request_timeout_counts_as_a_timeout
    server = start_with_status("--timeout", "1", workers: 1)
    slow = server.tcp
    slow.write("GET /sleep?t=5 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 503, read_response(slow).status, "the request timeout cut it"
    snap = wait_for { (s = status)["worker_exits"]["timeout"] == 1 && s }
    assert_equal 0, snap["worker_exits"].except("timeout").values.sum, snap["worker_exits"].inspect
    assert_equal 1.0, parse_prometheus(stats_get("/metrics")[1])["blackbuck_worker_exits_total"]['{reason="timeout"}']
  ensure
    slow&.close
  end

  # A histogram's bucket holds requests up to its bound: interpolating in it read one 0.3 s request
  # (bucket 0.25-0.5 s) as a p99 of 0.4975 s (issue 32: 8.2 s for requests whose slowest took 5 s).
  def test_percentiles_never_exceed_the_slowest_request
    server = start_with_status(workers: 1)
    res = request(server.tcp, "GET", "/sleep?t=0.3")
    assert_equal 200, res.status
    recent = wait_for { (s = status)["recent"]["requests"] == 1 && s["recent"] }
    # the server's own measure of its one request (it ends after the client has the answer: the
    # client's clock is no bound for it)
    slowest = parse_prometheus(stats_get("/metrics")[1])["blackbuck_request_duration_seconds_sum"][""]
    assert_operator slowest, :>=, 0.3
    assert_operator recent["duration"]["p99"], :>=, 0.3
    assert_operator recent["duration"]["p99"], :<=, slowest + 0.000001, "p99 above the slowest request"
    assert_operator recent["duration"]["p50"], :<=, slowest + 0.000001
    out, err, st = status_command("unix:#{@stats}")
    assert st.success?, err
    p99 = Float(out[/app p50 \S+ p99 ([\d.]+)ms/, 1]) / 1000
    assert_operator p99, :<=, slowest.round(4) + 0.0001, "blackbuck status: #{out.lines[1]}"
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

  # The request stays in the app (gate.ru) until the command has printed: however long the
  # command takes to start, it sees one worker busy.
  def test_status_command_prints_a_table_and_json
    gates = Dir.mktmpdir("bb-gates")
    server = start_with_status(workers: 2, app: "gate.ru", env: { "BB_GATE_DIR" => gates })
    busy = server.tcp
    busy.write("GET /gate?name=table HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for { status["totals"].values_at("busy", "idle") == [1, 1] }

    out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status", "unix:#{@stats}")
    assert st.success?, err
    assert_match(/master pid #{server.pid}/, out)
    assert_match(/workers 2 \(busy 1, idle 1\)/, out)
    assert_match(/^WORKER\s+PID\s+STATE\s+REQUESTS\s+CONNS\s+STREAMS\s+CURRENT\s+RUNNING/, out)
    assert_match(%r{^\d+\s+\d+\s+busy\s+\d+\s+\d+\s+0\s+GET /gate\s+\d+\.\d{3}s}, out)
    assert_match(/^\d+\s+\d+\s+idle\s/, out)
    assert_match(/^LISTENER\s+QUEUED\s+BACKLOG$/, out)
    assert_match(%r{^http://127\.0\.0\.1:\d+\s+\d+\s+\d+$}, out)

    out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status", "--json", "unix:#{@stats}")
    assert st.success?, err
    assert_equal server.pid, JSON.parse(out)["pid"]
    File.write(File.join(gates, "table"), "")
    assert_equal 200, read_response(busy).status
  ensure
    File.write(File.join(gates, "table"), "") if gates && Dir.exist?(gates)
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
  ensure
    FileUtils.rm_rf(dir)
  end

  # `blackbuck status` run as a user would: [stdout, stderr, Process::Status]. BLACKBUCK_STATS is
  # unset unless env sets it.
  def status_command(*args, env: {}, chdir: ROOT)
    Open3.capture3({ "BLACKBUCK_STATS" => nil }.merge(env), RbConfig.ruby, EXE, "status", *args, chdir: chdir)
  end

  def test_status_command_without_an_address_says_how_to_give_one
    out, err, st = status_command
    assert_equal 2, st.exitstatus
    assert_equal "", out
    assert_equal "blackbuck status: no address: give ADDR, -c FILE with stats_listen, or set BLACKBUCK_STATS " \
                 "(e.g. BLACKBUCK_STATS=127.0.0.1:9393)\n", err
    Dir.mktmpdir("bb-test") do |d|
      File.write("#{d}/blackbuck.rb", "workers 2\n")
      _out, err, st = status_command("-c", "#{d}/blackbuck.rb")
      assert_equal 2, st.exitstatus
      want = "blackbuck status: #{d}/blackbuck.rb sets no stats_listen and $BLACKBUCK_STATS is not set: give ADDR"
      assert err.start_with?(want), err
      assert_equal 1, err.lines.size
    end
    _out, err, st = status_command("unix:/a", "unix:/b")
    assert_equal 2, st.exitstatus
    assert_match(/\Ablackbuck status: want at most one ADDR/, err)
  end

  def test_status_command_finds_the_address_in_the_environment_or_the_config_file
    server = start_with_status(workers: 1)
    out, err, st = status_command(env: { "BLACKBUCK_STATS" => "unix:#{@stats}" })
    assert st.success?, err
    assert_match(/master pid #{server.pid}/, out)
    assert_match(/^WORKER\s+PID\s+STATE/, out)

    # Evaluated with the config DSL: hooks are stored, never run; an explicit -c wins over the env.
    mark = "#{server.dir}/hook-ran"
    File.write("#{server.dir}/blackbuck.rb", <<~RUBY)
      workers 3
      stats_listen "unix:#{@stats}"
      before_fork { |_server, _i| File.write(#{mark.inspect}, "before_fork") }
      after_fork { |_server, _i| File.write(#{mark.inspect}, "after_fork") }
    RUBY
    out, err, st = status_command("-c", "#{server.dir}/blackbuck.rb", env: { "BLACKBUCK_STATS" => "127.0.0.1:1" })
    assert st.success?, err
    assert_match(/master pid #{server.pid}/, out)
    refute File.exist?(mark), "a hook of the config file ran"
    out, err, st = status_command("--json", "-c", "#{server.dir}/blackbuck.rb")
    assert st.success?, err
    assert_equal server.pid, JSON.parse(out)["pid"]

    # without -c, config/blackbuck.rb of the current directory (the file the server reads)
    FileUtils.mkdir_p("#{server.dir}/app/config")
    File.write("#{server.dir}/app/config/blackbuck.rb", "stats_listen \"unix:#{@stats}\"\n")
    out, err, st = status_command(chdir: "#{server.dir}/app")
    assert st.success?, err
    assert_match(/master pid #{server.pid}/, out)

    File.write("#{server.dir}/broken.rb", "stats_listen \"127.0.0.1:99999\"\n")
    out, err, st = status_command("-c", "#{server.dir}/broken.rb")
    assert_equal [1, ""], [st.exitstatus, out]
    assert_equal "blackbuck status: #{server.dir}/broken.rb:1: invalid port in stats_listen address \"127.0.0.1:99999\" (0..65535)\n", err
  end

  def test_status_command_pointed_at_an_app_says_it_is_not_a_status_listener
    server = start_with_status(workers: 1) # kitchen.ru: GET /status answers 500 (no ?s=)
    addr = "127.0.0.1:#{server.tcp_port}"
    out, err, st = status_command(addr)
    assert_equal [1, ""], [st.exitstatus, out]
    assert_equal "blackbuck status: #{addr} is not a Blackbuck status listener (it answered 500)\n", err

    hello = start_both(app: "hello.ru") # answers 200 "hello world" to everything
    addr = "127.0.0.1:#{hello.tcp_port}"
    _out, err, st = status_command(addr)
    assert_equal 1, st.exitstatus
    assert_equal "blackbuck status: #{addr} is not a Blackbuck status listener " \
                 "(it answered 200 without a blackbuck-status header)\n", err
    _out, err, st = status_command("unix:#{hello.unix_path}")
    assert_equal 1, st.exitstatus
    assert_match(/is not a Blackbuck status listener \(it answered 200 without/, err)
  end

  # Answers a server might give, each from a one-shot listener on 127.0.0.1.
  def test_status_command_refuses_answers_that_are_not_blackbuck_status
    json = JSON.generate("pid" => 1, "workers" => [], "listeners" => [], "totals" => {})
    {
      "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n" => "it answered 404",
      "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: #{json.bytesize}\r\n\r\n#{json}" =>
        "it answered 200 without a blackbuck-status header",
      "HTTP/1.1 200 OK\r\nblackbuck-status: 1\r\ncontent-length: 6\r\n\r\n<html>" =>
        "its answer is not Blackbuck status JSON",
      "HTTP/1.1 200 OK\r\nblackbuck-status: 1\r\ncontent-length: 11\r\n\r\n{\"pid\": 12}" =>
        "its answer is not Blackbuck status JSON",
      "SSH-2.0-OpenSSH_9.2\r\n" => "it did not answer in HTTP"
    }.each do |answer, reason|
      listener = TCPServer.new("127.0.0.1", 0)
      conn = nil
      peer = Thread.new do
        conn = listener.accept
        conn.readpartial(4096)
        conn.write(answer) # and keep the connection open until the command has exited: it must decide
        # without EOF (a client that waited for it would end with "no answer within 5s" instead)
      end
      addr = "127.0.0.1:#{listener.addr[1]}"
      out, err, st = status_command(addr)
      assert_equal [1, ""], [st.exitstatus, out], answer
      assert_equal "blackbuck status: #{addr} is not a Blackbuck status listener (#{reason})\n", err
      peer.join
    ensure
      peer&.kill&.join
      conn&.close
      listener&.close
    end
  end

  # GET /hello on a connection of its own.
  def fresh_get(server)
    io = server.tcp
    request(io, "GET", "/hello")
  ensure
    io&.close
  end

  # The blackbuck_requests_total samples: {labels => value}.
  def requests_counters = parse_prometheus(stats_get("/metrics")[1])["blackbuck_requests_total"]

  def test_request_counts_survive_worker_recycling
    server = start_with_status("--max-requests-per-child", "5", workers: 1, app: "hello.ru")
    last = {}
    23.times do |i|
      assert_equal 200, fresh_get(server).status, "request #{i + 1}"
      now = requests_counters
      last.each { |labels, v| assert_operator now.fetch(labels, -1), :>=, v, "#{labels} went down at request #{i + 1}" }
      last = now
    end
    wait_for { server.worker_pids.size == 5 } # recycled after 5, 10, 15, 20 requests
    assert_equal 4, server.log.scan(/exiting after 5 requests/).size
    snap = wait_for { (s = status)["totals"]["requests"] == 23 && s }
    assert_equal 3, snap["workers"].first["requests"], "the live worker's own count starts again at 0"
    assert_equal [{ "index" => 0, "requests" => 23 }], snap["slots"]
    counters = requests_counters
    assert_operator counters.values.sum, :>=, 23
    assert_equal({ '{worker="0"}' => 23.0 }, counters)
    last.each { |labels, v| assert_operator counters.fetch(labels, -1), :>=, v }
    out, err, st = status_command("unix:#{@stats}")
    assert st.success?, err
    assert_match(/ requests 23 /, out)
  end

  # The master reads a dead worker's count from its scoreboard slot before the replacement
  # resets it: a worker killed by SIGKILL in the middle of a request keeps what it finished.
  def test_a_worker_killed_mid_request_keeps_its_count
    server = start_with_status(workers: 1)
    3.times { assert_equal 200, fresh_get(server).status }
    busy = server.tcp
    busy.write("GET /sleep?t=30 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for { status["totals"]["busy"] == 1 }
    victim = server.worker_pids.first
    Process.kill(:KILL, victim)
    assert closed_by_peer?(busy), "the client of the killed request sees the connection close"
    wait_for { server.worker_pids.size == 2 }
    2.times { assert_equal 200, fresh_get(server).status }
    snap = wait_for { (s = status)["totals"]["requests"] >= 5 && s }
    assert_equal 5, snap["totals"]["requests"], "3 before the kill, 2 after; the killed request not counted"
    assert_equal 2, snap["workers"].first["requests"]
    assert_equal({ '{worker="0"}' => 5.0 }, requests_counters)
  ensure
    busy&.close
  end

  def test_a_slow_status_client_does_not_stall_the_master
    server = start_with_status(workers: 1)
    silent = UNIXSocket.new(@stats) # connects and never sends
    assert_equal 200, stats_get("/status")[0]
    # answered while the master still holds the silent connection (a master that waited on it
    # would have answered only after giving up on it, at its read deadline)
    assert_nil silent.wait_readable(0), "the silent connection was still open when /status was answered"
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

  IDLE_CLIENTS = 1_000 # status connections that connect and send nothing
  SLOW_CLIENTS = 20    # status connections that trickle a request head that never completes
  PROBES = 10          # GET /live probes, each on a fresh connection
  # seconds a probe is waited for before the test fails: generous (a loaded machine), and far below
  # what the old listener took behind 1,000 idle connections (0.2 s each, in turn). How fast a probe
  # is answered is a performance goal (the issue's 50 ms), not something a test asserts: what the
  # tests assert is the state, the probes answered while every idle and slow connection is still held.
  PROBE_WAIT = 30

  # The status listener on TCP 127.0.0.1 (what a Kubernetes probe uses); [server, port].
  def start_with_tcp_status(workers: 1)
    server = start_server(["-l", "127.0.0.1:0", "--stats-listen", "127.0.0.1:0"], workers: workers, app: "hello.ru")
    port = Integer(server.log[%r{status listening on http://127\.0\.0\.1:(\d+)}, 1])
    [server, port]
  end

  # GET /live on a fresh connection, its whole answer (the listener closes after it) waited for up to
  # timeout seconds. Read with a plain wait, not Timeout (a thread per call).
  def live_probe(port, timeout: PROBE_WAIT)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    io = TCPSocket.new("127.0.0.1", port)
    io.write("GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = +""
    while (chunk = io.read_nonblock(4096, exception: false))
      next answer << chunk unless chunk == :wait_readable

      left = t + timeout - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      flunk "GET /live: no answer within #{timeout} s" unless left.positive? && io.wait_readable(left)
    end
    assert_match(%r{\AHTTP/1\.1 200 OK\r\n.*\r\n\r\nlive\n\z}m, answer, "GET /live")
  ensure
    io&.close
  end

  # This process holds 1,000+ sockets, and so does the server it starts (it inherits the limit).
  def with_open_files(count)
    soft, hard = Process.getrlimit(:NOFILE)
    skip "RLIMIT_NOFILE hard limit #{hard} < #{count}" if hard < count
    Process.setrlimit(:NOFILE, [soft, count].max, hard)
    yield
  ensure
    Process.setrlimit(:NOFILE, soft, hard) if soft
  end

  # Issue 21: the master used to read each status client in turn, up to 0.2 s each, so 10 idle
  # connections held a probe 1.9 s and 50 made it time out.
  def test_live_is_answered_at_once_beside_a_thousand_idle_and_slow_status_connections
    with_open_files(IDLE_CLIENTS + SLOW_CLIENTS + 512) do
      server, port = start_with_tcp_status
      held = socket_fds(server.pid)
      idle = Array.new(IDLE_CLIENTS) { TCPSocket.new("127.0.0.1", port) }
      slow = Array.new(SLOW_CLIENTS) { TCPSocket.new("127.0.0.1", port).tap { |s| s.write("GET /live HTTP/1.1\r\n") } }
      trickle = Thread.new do # a byte per slow connection at a time; the head never ends
        loop do
          slow.each { |s| s.write_nonblock("a", exception: false) }
          sleep 0.01
        end
      rescue IOError, SystemCallError
        nil
      end
      wait_for { socket_fds(server.pid) >= held + IDLE_CLIENTS + SLOW_CLIENTS }

      PROBES.times { live_probe(port) }

      assert_operator socket_fds(server.pid), :>=, held + IDLE_CLIENTS + SLOW_CLIENTS,
                      "the master still held every idle and slow connection after the probes"
      # Each is closed at its read deadline; none answered (no request head came).
      wait_for { socket_fds(server.pid) <= held }
      assert closed_by_peer?(idle.first)
      assert_equal "", read_all(idle.last, timeout: 1)
      assert_equal 200, fresh_get(server).status
    ensure
      trickle&.kill&.join
      [*idle, *slow].each(&:close)
    end
  end

  # Beyond MAX_CLIENTS a new connection closes the oldest one still sending its request, so a
  # flood of idle connections cannot keep a probe out.
  def test_past_the_connection_cap_the_oldest_idle_connection_makes_room_for_a_probe
    require "blackbuck"
    cap = Blackbuck::StatusServer::MAX_CLIENTS
    with_open_files(cap * 2 + 512) do
      server, port = start_with_tcp_status
      held = socket_fds(server.pid)
      idle = Array.new(cap + 100) { TCPSocket.new("127.0.0.1", port) }
      wait_for { closed_by_peer?(idle[99], timeout: 0.05) }
      assert_equal held + cap, socket_fds(server.pid), "the master holds MAX_CLIENTS status connections"
      PROBES.times { live_probe(port) }
      assert closed_by_peer?(idle.first), "the oldest was closed to make room"
    ensure
      idle&.each(&:close)
    end
  end

  # The master's TCP listening sockets on port (from /proc/net/tcp and tcp6): ["127.0.0.1", ...].
  def listening_hosts(port)
    %w[tcp tcp6].flat_map do |f|
      File.readlines("/proc/net/#{f}").drop(1).filter_map do |line|
        local, _remote, st = line.split[1, 3]
        hex, port_hex = local.split(":")
        next unless st == "0A" && port_hex.to_i(16) == port # 0A: LISTEN

        bytes = [hex].pack("H*").unpack("N*").pack("V*").bytes # each 32-bit word is in host (little-endian) order
        bytes.size == 4 ? bytes.join(".") : IPAddr.new_ntoh(bytes.pack("C*")).to_s
      end
    end
  end

  # Issue 21: a bare --stats-listen PORT (or :PORT, or stats_listen "PORT" in a config file) is
  # an unauthenticated status page, so it binds loopback; 0.0.0.0:PORT exposes it on purpose. The
  # app's listeners keep their meaning: a bare port binds every interface.
  def test_a_bare_status_port_binds_loopback_only
    require "ipaddr"
    dir = Dir.mktmpdir("bb-test")
    port = free_port
    File.write("#{dir}/blackbuck.rb", "stats_listen \"#{free_port}\"\n")
    {
      ["--stats-listen", port.to_s] => port,
      ["--stats-listen", ":#{port}"] => port,
      ["-c", "#{dir}/blackbuck.rb"] => Integer(File.read("#{dir}/blackbuck.rb")[/\d+/])
    }.each do |args, want|
      app = free_port
      server = start_server(["-l", app.to_s, *args], dir: dir)
      assert_includes server.log, "status listening on http://127.0.0.1:#{want}\n", args.inspect
      assert_equal ["127.0.0.1"], listening_hosts(want), "#{args.inspect}: the status listener is on loopback only"
      assert_equal ["0.0.0.0"], listening_hosts(app), "-l #{app}: an app listener's bare port is every interface"
      assert_equal 0, status_command(want.to_s)[2].exitstatus, "blackbuck status PORT reads it"
      server.stop
    end
    server = start_server(["-l", "127.0.0.1:0", "--stats-listen", "0.0.0.0:#{port}"], dir: dir)
    assert_includes server.log, "status listening on http://0.0.0.0:#{port}\n"
    assert_equal ["0.0.0.0"], listening_hosts(port)
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
