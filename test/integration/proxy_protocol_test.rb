# frozen_string_literal: true

require_relative "../test_helper"
require "ipaddr"
require "json"

# PROXY protocol v1 and v2 on a listener (--proxy-protocol, listen ..., proxy_protocol: true): the
# balancer's header names the client, REMOTE_ADDR says so for every request of the connection; a
# connection without a valid header is closed unanswered; the header has a deadline.
class ProxyProtocolTest < ServerTest
  SIG = "\r\n\r\n\0\r\nQUIT\n".b
  HTTP_GET_ENV = "GET /env HTTP/1.1\r\nHost: a\r\n\r\n"

  def v1(src, dst = "127.0.0.1", sport = 56_324, dport = 80, family: src.include?(":") ? "TCP6" : "TCP4")
    "PROXY #{family} #{src} #{dst} #{sport} #{dport}\r\n"
  end

  # A v2 PROXY header (command 1) for a TCP client; tlvs: extra bytes after the addresses.
  def v2(src, dst, sport = 56_324, dport = 80, tlvs: "".b)
    six = src.include?(":")
    addrs = [IPAddr.new(src).hton, IPAddr.new(dst).hton, [sport, dport].pack("nn")].join
    SIG + [0x21, six ? 0x21 : 0x11, addrs.bytesize + tlvs.bytesize].pack("CCn") + addrs + tlvs
  end

  def v2_local = SIG + [0x20, 0x00, 0].pack("CCn")

  def tlv(type, value) = [type, value.bytesize].pack("Cn") + value.b

  def start_proxied(args = [], app: "kitchen.ru")
    start_server(["-l", "127.0.0.1:0", "--proxy-protocol", *args], app: app)
  end

  # The env of one GET /env on io, as JSON.
  def env_on(io, timeout: 10)
    io.write(HTTP_GET_ENV)
    res = read_response(io, timeout: timeout)
    assert_equal 200, res&.status, "GET /env answered"
    JSON.parse(res.body)
  end

  def test_v1_sets_remote_addr_for_every_request_on_the_connection
    server = start_proxied
    io = server.tcp
    io.write(v1("203.0.113.7") + HTTP_GET_ENV) # the header and the first request in one packet
    res = read_response(io)
    assert_nil res["connection"], "the server keeps the connection open"
    assert_equal "203.0.113.7", JSON.parse(res.body)["REMOTE_ADDR"]
    second = env_on(io) # on the same connection: no PROXY header before this one
    assert_equal "203.0.113.7", second["REMOTE_ADDR"], "keep-alive: the next request too"
    io.close

    io = server.tcp
    io.write(v1("2001:db8::17", "2001:db8::1"))
    assert_equal "2001:db8::17", env_on(io)["REMOTE_ADDR"], "TCP6, the request in a later packet"
    io.close
    io = server.tcp
    io.write(v1("::ffff:192.0.2.9", "::1"))
    assert_equal "192.0.2.9", env_on(io)["REMOTE_ADDR"], "an IPv4-mapped client is shown as IPv4, as accept does"
    io.close
    io = server.tcp
    io.write("PROXY UNKNOWN\r\n")
    assert_equal "127.0.0.1", env_on(io)["REMOTE_ADDR"], "UNKNOWN keeps the real peer"
  ensure
    io&.close
  end

  def test_v2_sets_remote_addr_and_skips_tlvs
    server = start_proxied
    io = server.tcp
    tlvs = tlv(0x02, "example.com") + tlv(0x05, "id-1") + tlv(0x04, "")
    io.write(v2("198.51.100.20", "127.0.0.1", tlvs: tlvs))
    assert_equal "198.51.100.20", env_on(io)["REMOTE_ADDR"]
    assert_equal "198.51.100.20", env_on(io)["REMOTE_ADDR"], "keep-alive"
    io.close

    io = server.tcp
    io.write(v2("2001:db8::42", "2001:db8::1") + HTTP_GET_ENV)
    assert_equal "2001:db8::42", JSON.parse(read_response(io).body)["REMOTE_ADDR"]
    io.close

    io = server.tcp
    io.write(v2_local + HTTP_GET_ENV)
    assert_equal "127.0.0.1", JSON.parse(read_response(io).body)["REMOTE_ADDR"], "LOCAL (a health check) keeps the peer"
  ensure
    io&.close
  end

  def test_header_split_into_pieces
    server = start_proxied
    io = server.tcp
    bytes = v2("192.0.2.33", "127.0.0.1", tlvs: tlv(0x02, "a.example")) + HTTP_GET_ENV
    prev = 0
    [1, 13, 15, 20, bytes.bytesize].each do |cut| # in the signature, version, family, length, addresses
      io.write(bytes[prev...cut])
      prev = cut
      sleep 0.05
    end
    assert_equal "192.0.2.33", JSON.parse(read_response(io).body)["REMOTE_ADDR"]
  ensure
    io&.close
  end

  def test_connection_without_a_header_is_closed_unanswered
    server = start_proxied
    {
      "plain HTTP" => "GET /env HTTP/1.1\r\nHost: a\r\n\r\n",
      "a bad v1 line" => "PROXY TCP4 1.2.3.256 127.0.0.1 1 2\r\n#{HTTP_GET_ENV}",
      "v1 with a bare LF" => "PROXY TCP4 1.2.3.4 127.0.0.1 1 2\n#{HTTP_GET_ENV}",
      "a v2 length past the limit" => SIG + [0x21, 0x11, 5000].pack("CCn"),
      "a v2 unknown command" => SIG + [0x22, 0x11, 12].pack("CCn") + ("\0" * 12)
    }.each do |what, bytes|
      io = server.tcp
      t = now
      io.write(bytes)
      assert_equal "", read_all(io, timeout: 5), "#{what}: no answer"
      assert_operator now - t, :<, 1.0, "#{what}: closed at once, not after a timeout"
      io.close
    end
    assert_fresh_request_served_proxied(server)
  end

  # Closed by the server (EOF, not a read that gave up) without a byte of answer.
  def assert_closed_unanswered(io, what)
    assert_equal "", read_all(io, timeout: 30), "#{what}: no answer"
    assert closed_by_peer?(io, timeout: 1), "#{what}: closed by the server"
  end

  def test_header_deadline
    server = start_proxied(["--header-timeout", "1"]) # the PROXY deadline is min(5 s, header_timeout)
    silent = server.tcp
    partial = server.tcp
    partial.write("PROXY TCP4 192.0.2.1 127.0.")
    t = now
    assert_closed_unanswered(partial, "a partial header")
    assert_operator now - t, :>=, 0.9, "not before the deadline" # (a lower bound: load only makes it later)
    assert_closed_unanswered(silent, "no byte at all")
    assert_fresh_request_served_proxied(server)
  ensure
    silent&.close
    partial&.close
  end

  # The worker is not held by connections whose header is slow: a fresh request is answered while they
  # are still open (the PROXY deadline, PROXY_HEADER_SECONDS, would close them).
  def test_slow_headers_do_not_hold_the_worker
    server = start_proxied
    silent = server.tcp
    partial = server.tcp
    partial.write("PROXY TCP4 192.0.2.1 127.0.")
    assert_fresh_request_served_proxied(server, held: -> { [silent, partial].none? { |io| io.wait_readable(0) } })
  ensure
    silent&.close
    partial&.close
  end

  # header_timeout 30: the PROXY deadline is Worker::PROXY_HEADER_SECONDS (5 s). It bounds the header
  # only: once the header is in, the connection waits for its request like a fresh one. The partial
  # header opened beside it is closed at that deadline: a request sent after that is past it.
  def test_proxy_header_seconds_bound_the_header_only
    server = start_proxied
    partial = server.tcp
    whole = server.tcp
    t = now
    partial.write("PROXY TCP4 192.0.2.1")
    whole.write(v1("192.0.2.5"))
    assert_closed_unanswered(partial, "a partial header")
    assert_operator now - t, :>=, 4.5 # (a lower bound)
    assert_equal "192.0.2.5", env_on(whole)["REMOTE_ADDR"], "a request after the PROXY deadline"
  ensure
    partial&.close
    whole&.close
  end

  def test_listener_without_the_flag_answers_proxy_as_a_bad_request
    server = start_server(["-l", "127.0.0.1:0"], app: "kitchen.ru")
    out = raw(server, v1("203.0.113.7") + HTTP_GET_ENV)
    assert_match(%r{\AHTTP/1\.1 400 }, out)
    out = raw(server, v2("203.0.113.7", "127.0.0.1") + HTTP_GET_ENV)
    assert_match(%r{\AHTTP/1\.1 400 }, out)
  end

  def test_per_listener_in_the_config_file_on_tcp_and_unix
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", <<~RUBY)
      listen "127.0.0.1:0"
      listen "unix:#{dir}/lb.sock", proxy_protocol: true
    RUBY
    server = start_server(["-c", "#{dir}/blackbuck.rb"], app: "kitchen.ru", dir: dir)
    assert_includes server.log, "listening on unix:#{dir}/lb.sock (PROXY protocol)"
    refute_match(%r{listening on http://127\.0\.0\.1:\d+ \(PROXY}, server.log)
    io = server.unix
    io.write(v2("192.0.2.77", "192.0.2.1") + HTTP_GET_ENV)
    assert_equal "192.0.2.77", JSON.parse(read_response(io).body)["REMOTE_ADDR"], "UNIX listener with PROXY"
    io.close
    assert_equal "", raw(server, HTTP_GET_ENV, transport: :unix, timeout: 5), "no header on it: no answer"
    io = server.tcp
    assert_equal "127.0.0.1", env_on(io)["REMOTE_ADDR"], "the TCP listener is plain HTTP"
  ensure
    io&.close
  end

  def test_command_line_flag_applies_to_its_own_listeners_only
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", %(listen "unix:#{dir}/plain.sock"\n))
    server = start_server(["-c", "#{dir}/blackbuck.rb", "-l", "127.0.0.1:0", "--proxy-protocol"],
                          app: "kitchen.ru", dir: dir)
    assert_match(%r{listening on http://127\.0\.0\.1:\d+ \(PROXY protocol\)}, server.log)
    assert_includes server.log, "listening on unix:#{dir}/plain.sock\n"
    io = server.unix
    assert_equal "127.0.0.1", env_on(io)["REMOTE_ADDR"], "the config file's listener stays plain"
    io.close
    io = server.tcp
    io.write(v1("192.0.2.8"))
    assert_equal "192.0.2.8", env_on(io)["REMOTE_ADDR"]
  ensure
    io&.close
  end

  def test_config_mistakes_are_one_line_and_fail
    out, status = run_cli("--proxy-protocol", "#{APPS}/hello.ru")
    assert_equal 2, status.exitstatus
    assert_equal ["blackbuck: invalid argument: --proxy-protocol applies to the listeners given with -l, " \
                  "and there is none (see blackbuck --help)"], out.lines.map(&:chomp)
    Dir.mktmpdir("bb-test") do |dir|
      File.write("#{dir}/c.rb", %(listen "127.0.0.1:0", proxy_protocol: "maybe"\n))
      out, status = run_cli("-c", "#{dir}/c.rb", "#{APPS}/hello.ru")
      assert_equal 1, status.exitstatus
      assert_equal ["blackbuck: #{dir}/c.rb:1: proxy_protocol must be true or false, got \"maybe\""], out.lines.map(&:chomp)
      File.write("#{dir}/c.rb", %(listen "127.0.0.1:0", proxy: true\n))
      out, status = run_cli("-c", "#{dir}/c.rb", "#{APPS}/hello.ru")
      assert_equal 1, status.exitstatus
      assert_equal 1, out.lines.size
      assert_match(/c\.rb:1: ArgumentError: unknown keyword: :proxy/, out)
    end
  end

  # Real HAProxy in front: send-proxy (v1, TCP mode: the header goes out at connect, the request
  # later) and send-proxy-v2 (HTTP mode, with health checks that carry the header too). Clients
  # connect from 127.0.0.2 and ::1 while Blackbuck's TCP peer is HAProxy on 127.0.0.1, so the
  # address can only come from the header.
  def test_behind_haproxy
    skip "haproxy is not installed (bin/setup installs it)" unless HAProxy.available?
    dir = Dir.mktmpdir("bb-test")
    stats = "#{dir}/status.sock"
    server = start_server(["-l", "127.0.0.1:0", "--proxy-protocol", "--stats-listen", "unix:#{stats}"], dir: dir,
                                                                                                       app: "kitchen.ru")
    haproxy = @haproxy = HAProxy.new(server.tcp_port)
    [[:v1, "127.0.0.2"], [:v1, "::1"], [:v2, "127.0.0.2"], [:v2, "::1"]].each do |version, client|
      io = haproxy.connect(version, from: client)
      assert_equal client, env_on(io)["REMOTE_ADDR"], "#{version} from #{client}"
      assert_equal client, env_on(io)["REMOTE_ADDR"], "#{version} from #{client}: the next request"
      io.close
    end
    # ten health checks answered (send-proxy-v2 sends them a header too; fall 1: one failure marks it down)
    served = status_json(stats)["totals"]["requests"]
    wait_for(15, "ten health checks answered") { status_json(stats)["totals"]["requests"] >= served + 10 }
    io = haproxy.connect(:v2, from: "127.0.0.2")
    assert_equal "127.0.0.2", env_on(io)["REMOTE_ADDR"], "the checks passed: the server is still up"
  ensure
    io&.close
  end

  def teardown
    @haproxy&.stop(show_log: !passed?)
    super
  end

  # Debian's haproxy, foreground, stopped by pid: a TCP-mode frontend to send-proxy and an HTTP-mode
  # one to send-proxy-v2 with health checks, both on 127.0.0.1 and ::1.
  class HAProxy
    BIN = "/usr/sbin/haproxy"

    def self.available? = File.executable?(BIN)

    def initialize(upstream_port)
      @dir = Dir.mktmpdir("bb-haproxy")
      @ports = { v1: free_port, v2: free_port }
      File.write("#{@dir}/haproxy.cfg", <<~CFG)
        global
          maxconn 64
        defaults
          timeout connect 5s
          timeout client 30s
          timeout server 30s
        frontend tcp_v1
          mode tcp
          bind 127.0.0.1:#{@ports[:v1]}
          bind [::1]:#{@ports[:v1]}
          default_backend blackbuck_v1
        backend blackbuck_v1
          mode tcp
          server bb 127.0.0.1:#{upstream_port} send-proxy
        frontend http_v2
          mode http
          bind 127.0.0.1:#{@ports[:v2]}
          bind [::1]:#{@ports[:v2]}
          default_backend blackbuck_v2
        backend blackbuck_v2
          mode http
          option httpchk GET /hello
          # A check's answer may take longer than `inter` on a busy machine: only a refused or failed
          # check (timeout check, not inter, bounds its answer) may take the server out.
          timeout check 5s
          server bb 127.0.0.1:#{upstream_port} send-proxy-v2 check inter 100ms fall 1 rise 1
      CFG
      @process = ChildProcess.new([BIN, "-db", "-f", "#{@dir}/haproxy.cfg"], log_path: "#{@dir}/out.log")
      Timeout.timeout(10) do
        @ports.each_value { |p| TCPSocket.new("127.0.0.1", p).close }
      rescue Errno::ECONNREFUSED
        raise "haproxy exited: #{@process.log}" if @process.exited?

        sleep 0.05
        retry
      end
    end

    def connect(version, from:)
      Socket.tcp(from.include?(":") ? "::1" : "127.0.0.1", @ports.fetch(version), from)
    end

    def stop(show_log: false)
      @process.stop
      warn "\n--- haproxy log ---\n#{@process.log}--- end ---" if show_log
      FileUtils.rm_rf(@dir)
    end

    private

    def free_port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
  end

  private

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def run_cli(*args)
    r, w = IO.pipe
    pid = Process.spawn(RbConfig.ruby, EXE, "--check", *args, out: w, err: w, in: File::NULL)
    w.close
    out = Timeout.timeout(20) { r.read }
    [out, Process.wait2(pid).last]
  ensure
    r&.close
  end

  # As assert_fresh_request_served: answered, and while held (when given) still says so.
  def assert_fresh_request_served_proxied(server, held: nil)
    io = server.tcp
    io.write(v1("192.0.2.200"))
    assert_equal "192.0.2.200", env_on(io, timeout: FRESH_WAIT)["REMOTE_ADDR"]
    assert held.call, "the fresh request was answered only once the slow clients had gone" if held
  ensure
    io&.close
  end
end
