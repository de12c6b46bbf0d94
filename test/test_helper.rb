# frozen_string_literal: true

require "minitest/autorun"
require "socket"
require "tmpdir"
require "timeout"
require "fileutils"
require "rbconfig"
require "json"
require_relative "support/slowest"

ROOT = File.expand_path("..", __dir__)
EXE = File.join(ROOT, "exe", "blackbuck")
APPS = File.join(__dir__, "apps")

# Any command run in its own process group with its output in a log file; stopped and cleaned
# up by pid and process group, never by name.
class ChildProcess
  attr_reader :pid, :log_path

  def initialize(cmd, log_path:, env: {}, chdir: nil)
    @log_path = log_path
    opts = { out: log_path, err: %i[child out], pgroup: true } # one open file: lines never overwrite each other
    opts[:chdir] = chdir if chdir
    @pid = Process.spawn(env, *cmd, **opts)
  end

  def log = File.exist?(@log_path) ? File.read(@log_path) : ""

  # Blackbuck's stable "worker N (pid P) ready" lines, in order, each pid once.
  def worker_pids = log.scan(/worker \d+ \(pid (\d+)\) ready/).flatten.map(&:to_i).uniq

  def exited?
    return true if @status

    pid, status = Process.waitpid2(@pid, Process::WNOHANG)
    @status = status if pid
    !@status.nil?
  end

  def status
    exited?
    @status
  end

  def signal(sig) = Process.kill(sig, @pid)

  # Waits for the process to exit; returns its Process::Status or nil on timeout.
  def wait_exit(timeout = 15)
    deadline = now + timeout
    until exited?
      return nil if now > deadline

      sleep 0.05
    end
    @status
  end

  # TERM, then KILL the whole process group if it lingers.
  def stop
    return if exited? && !group_alive?

    begin
      Process.kill(:TERM, @pid) unless exited?
    rescue Errno::ESRCH
      nil
    end
    wait_exit(10)
    kill_group
  end

  def kill_group
    Process.kill(:KILL, -@pid) if group_alive?
  rescue Errno::ESRCH, Errno::EPERM
    nil
  ensure
    begin
      Process.waitpid(@pid) unless @status
    rescue Errno::ECHILD
      nil
    end
  end

  def group_alive?
    Process.kill(0, -@pid)
    true
  rescue Errno::ESRCH, Errno::EPERM
    false
  end

  private

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

# A real `exe/blackbuck` process. Listeners are bound to port 0 and the real port is read
# from the "listening on" log lines, so there are no port races. Its log is printed when a
# test fails.
class ServerProcess < ChildProcess
  attr_reader :addrs, :dir, :workers

  # BLACKBUCK_TEST_THREADS=N (rake test:threads): every server runs its app on N threads, unless
  # the test sets --threads itself.
  THREADS = ENV.fetch("BLACKBUCK_TEST_THREADS", nil)
  # BLACKBUCK_TEST_STREAMS=1 (rake test:streams): every server runs with the streams setting, unless
  # the test sets it itself.
  STREAMS = ENV["BLACKBUCK_TEST_STREAMS"] == "1"

  def initialize(args, app: "hello.ru", workers: 1, env: {}, dir: nil, wait: true, chdir: nil)
    args = [*args, "--threads", THREADS] if THREADS && !args.include?("--threads")
    args = [*args, "--streams"] if STREAMS && !args.include?("--streams") && !args.include?("--no-streams")
    @dir = dir || Dir.mktmpdir("bb-test")
    @workers = workers
    rackup = app.start_with?("/") ? app : File.join(APPS, app)
    super([RbConfig.ruby, EXE, "-w", workers.to_s, *args, rackup], log_path: File.join(@dir, "server.log"), env: env,
                                                                     chdir: chdir)
    begin
      wait_ready if wait
    rescue StandardError
      stop # the caller never gets this object to stop: a server that did not come up must not outlive the test
      raise
    end
  end

  # timeout: a bound for a boot that went wrong, not a measure (a loaded machine boots Ruby slowly).
  def wait_ready(timeout: 60)
    deadline = now + timeout
    loop do
      l = log
      if l.scan(/worker \d+ \(pid \d+\) ready/).size >= @workers
        @addrs = l.scan(/listening on (\S+)/).flatten
        return self
      end
      raise "server exited early:\n#{l}" if exited?
      raise "server not ready after #{timeout}s:\n#{l}" if now > deadline

      sleep 0.05
    end
  end

  def tcp_port = Integer(@addrs.find { |a| a.start_with?("http://") }[/:(\d+)\z/, 1])
  def tcp_host = @addrs.find { |a| a.start_with?("http://") }[%r{http://\[?([^\]]+?)\]?:\d+\z}, 1]
  def unix_path = @addrs.find { |a| a.start_with?("unix:") }&.delete_prefix("unix:")

  def tcp = TCPSocket.new(tcp_host, tcp_port)
  def unix = UNIXSocket.new(unix_path)
end

# Debian's nginx in front of an upstream ("unix:/path" or "HOST:PORT") with upstream keep-alive,
# as docs/DEPLOY.md recommends, listening on 127.0.0.1:#port. Started and stopped by pid.
class NginxProxy
  BIN = "/usr/sbin/nginx"

  def self.available? = File.executable?(BIN)

  attr_reader :port, :dir

  # forwarded_proto: the X-Forwarded-Proto it sets (a TLS-terminating proxy says "https").
  def initialize(upstream, forwarded_proto: "$scheme", user: Process.uid.zero? ? "root" : nil)
    @dir = Dir.mktmpdir("bb-nginx")
    @port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    File.write("#{@dir}/nginx.conf", <<~CONF)
      #{"user #{user};" if user}
      worker_processes 1;
      daemon off;
      pid #{@dir}/nginx.pid;
      error_log #{@dir}/error.log;
      events { worker_connections 256; }
      http {
        access_log off;
        client_max_body_size 64m;
        client_body_temp_path #{@dir}/body; proxy_temp_path #{@dir}/proxy;
        fastcgi_temp_path #{@dir}/fcgi; uwsgi_temp_path #{@dir}/uwsgi; scgi_temp_path #{@dir}/scgi;
        upstream app { server #{upstream} fail_timeout=0; keepalive 16; }
        server {
          listen 127.0.0.1:#{@port};
          location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto #{forwarded_proto};
          }
        }
      }
    CONF
    @process = ChildProcess.new([BIN, "-p", @dir, "-c", "#{@dir}/nginx.conf"], log_path: "#{@dir}/out.log")
    Timeout.timeout(10) do
      TCPSocket.new("127.0.0.1", @port).close
    rescue Errno::ECONNREFUSED
      raise "nginx exited: #{@process.log}" if @process.exited?

      sleep 0.05
      retry
    end
  end

  def error_log = File.exist?("#{@dir}/error.log") ? File.read("#{@dir}/error.log") : ""

  def stop
    @process.stop
    FileUtils.rm_rf(@dir)
  end
end

# A parsed HTTP/1.x response.
Response = Struct.new(:status, :headers, :body, :raw) do
  def [](name) = headers[name.downcase]
end

module HTTPHelpers
  # Reads one response from io (Content-Length, chunked, or until EOF). nil if the peer closed first.
  def read_response(io, head_request: false, timeout: 10)
    buf = +""
    Timeout.timeout(timeout) do
      buf << io.readpartial(65_536) until buf.include?("\r\n\r\n")
      head, rest = buf.split("\r\n\r\n", 2)
      lines = head.split("\r\n")
      status = lines.shift[/\AHTTP\/1\.[01] (\d{3})/, 1].to_i
      headers = {}
      lines.each do |l|
        k, v = l.split(":", 2)
        key = k.downcase
        headers[key] = headers.key?(key) ? "#{headers[key]}, #{v.strip}" : v.strip
      end
      body = +""
      if head_request || status == 204 || status == 304 || (100..199).cover?(status)
        io.ungetbyte(rest) unless rest.empty? # rubocop:disable Style/SoleNestedConditional
      elsif headers["transfer-encoding"]&.include?("chunked")
        data = rest
        loop do
          data << io.readpartial(65_536) until data.include?("\r\n")
          size_line, data = data.split("\r\n", 2)
          size = size_line.to_i(16)
          if size.zero?
            data << io.readpartial(65_536) until data.include?("\r\n")
            data = data.split("\r\n", 2)[1]
            io.ungetbyte(data) unless data.empty?
            break
          end
          data << io.readpartial(65_536) while data.bytesize < size + 2
          body << data.byteslice(0, size)
          data = data.byteslice(size + 2..)
        end
      elsif (len = headers["content-length"])
        len = len.to_i
        rest << io.readpartial(65_536) while rest.bytesize < len
        body = rest.byteslice(0, len)
        extra = rest.byteslice(len..)
        io.ungetbyte(extra) unless extra.empty?
      else
        body = rest
        begin
          loop { body << io.readpartial(65_536) }
        rescue EOFError
          nil
        end
      end
      Response.new(status, headers, body, head)
    end
  rescue EOFError, Errno::ECONNRESET
    nil
  end

  def request(io, method, path, headers: {}, body: nil, version: "1.1")
    h = { "Host" => "localhost" }.merge(headers)
    h["Content-Length"] = body.bytesize.to_s if body && !h.key?("Transfer-Encoding")
    io.write("#{method} #{path} HTTP/#{version}\r\n#{h.map { |k, v| "#{k}: #{v}\r\n" }.join}\r\n#{body}")
    read_response(io, head_request: method == "HEAD")
  end

  # Everything the peer sends until it closes (or timeout, or a reset).
  def read_all(io, timeout: 10)
    out = +""
    Timeout.timeout(timeout) { loop { out << io.readpartial(65_536) } }
  rescue EOFError, Errno::ECONNRESET, Timeout::Error
    out
  end

  # Sends raw bytes on a fresh connection and reads until EOF (or timeout).
  def raw(server, data, transport: :tcp, timeout: 10)
    io = transport == :tcp ? server.tcp : server.unix
    io.write(data)
    out = +""
    Timeout.timeout(timeout) do
      loop { out << io.readpartial(65_536) }
    end
  rescue EOFError, Errno::ECONNRESET
    out
  ensure
    io&.close
  end

  # GET target from a status listener on a UNIX socket (--stats-listen): the body.
  def stats_get(path, target)
    io = UNIXSocket.new(path)
    io.write("GET #{target} HTTP/1.1\r\nHost: x\r\n\r\n")
    read_response(io).body
  ensure
    io&.close
  end

  # `clients` keep-alive clients (threads) each send `per_client` numbered GETs to handoff.ru on
  # the server's UNIX socket, one at a time; every `slow_every`-th waits 30 ms. A connection closed
  # before its answer (a recycled worker closes idle ones) is opened again and the request sent
  # again: it reached no app. Returns [[id, status, the id the answer echoes, the pid that ran it], ...].
  def numbered_requests(server, clients:, per_client:, slow_every:)
    Array.new(clients) do |c|
      Thread.new do
        io = nil
        Array.new(per_client) do |i|
          id = "#{c}-#{i}"
          path = i % slow_every == slow_every - 1 ? "/?sleep=0.03&id=#{id}" : "/?id=#{id}"
          res = nil
          20.times do
            io ||= server.unix
            res = begin
              request(io, "GET", path)
            rescue Errno::EPIPE, Errno::ECONNRESET
              nil
            end
            (io.close; io = nil) if res.nil? || res["connection"] == "close"
            break if res
          end
          [id, res&.status, res&.body.to_s[/ id=([\w-]+)/, 1], res&.body.to_s[/pid=(\d+)/, 1].to_i]
        end
      ensure
        io&.close
      end
    end.flat_map(&:value)
  end

  # True when the peer closed: read returns EOF (or reset) within timeout.
  def closed_by_peer?(io, timeout: 5)
    Timeout.timeout(timeout) { loop { io.readpartial(65_536) } }
  rescue EOFError, Errno::ECONNRESET
    true
  rescue Timeout::Error
    false
  end
end

# For tests of handoff.ru (its answers name the worker: "pid=123 ..."), whose requests move between workers.
module HandoffHelpers
  # GET path on io: its answer, which must be a 200.
  def get(io, path)
    res = request(io, "GET", path)
    refute_nil res, "no answer to GET #{path}"
    assert_equal 200, res.status
    res
  end

  # Sends a GET without waiting for its answer.
  def send_get(io, path) = io.write("GET #{path} HTTP/1.1\r\nHost: localhost\r\n\r\n")

  # The pid of the worker that ran it.
  def served_by(res) = Integer(res.body[/pid=(\d+)/, 1])

  # Two keep-alive connections on the same worker (each has served one request): [a, b, pid].
  # A worker accepts every pending connection at once, so a handful opened together share one.
  # open: makes a connection (-> { server.tcp }).
  def same_worker_pair(open)
    conns = Array.new(8) { open.call }
    pids = conns.map { |c| served_by(get(c, "/")) }
    i, j = (0...conns.size).to_a.combination(2).find { |x, y| pids[x] == pids[y] }
    refute_nil i, "no two of 8 connections landed on one worker: #{pids.inspect}"
    (conns - [conns[i], conns[j]]).each(&:close)
    [conns[i], conns[j], pids[i]]
  end
end

# Base class: starts servers through #start_server, stops them after each test, and dumps
# their logs when a test fails.
class ServerTest < Minitest::Test
  include HTTPHelpers

  def start_server(args = [], **opts)
    s = ServerProcess.new(args, **opts)
    (@servers ||= []) << s
    s
  rescue StandardError
    (@servers ||= []) << s if s
    raise
  end

  # Listeners on TCP 127.0.0.1 and a UNIX socket in a fresh directory; stats: a status listener too,
  # at #stats_path(server), through which a test sees the workers' state.
  def start_both(args = [], stats: false, **opts)
    dir = Dir.mktmpdir("bb-test")
    args = [*args, "--stats-listen", "unix:#{dir}/status.sock"] if stats
    start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", *args], dir: dir, **opts)
  end

  # Where start_both(stats: true) puts the status listener (a UNIX socket in the server's directory).
  def stats_path(server) = "#{server.dir}/status.sock"

  FRESH_WAIT = 30 # seconds a fresh request is waited for: a loaded machine's, never a bound on its speed

  # GET /hello on a new connection; returns the seconds it took.
  def timed_fresh_request(server, timeout: FRESH_WAIT)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    io = server.tcp
    res = Timeout.timeout(timeout) { request(io, "GET", "/hello") }
    assert_equal 200, res&.status
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
  ensure
    io&.close
  end

  # The worker is not held by whatever the test set up (slow clients, a stalled reader...): a fresh
  # request is answered, and, when held is given, while it still says they are there. A worker they
  # held would answer only once their deadline had let it go (held then says false), so no time is
  # measured: the state at the answer is the proof.
  def assert_fresh_request_served(server, behind: "slow clients", held: nil)
    timed_fresh_request(server)
    assert held.call, "the fresh request was answered only once #{behind} had gone: it waited for them" if held
  end

  # Polls the block until it returns a truthy value (returned), or raises after timeout. Tests wait
  # for the state they assert this way, never for a time: a loaded machine makes any time too short.
  def wait_for(timeout = 15, what = "condition")
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until (v = yield)
      raise "#{what} not met within #{timeout}s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
    v
  end

  # The /status JSON of a status listener on a UNIX socket (--stats-listen unix:PATH).
  def status_json(stats) = JSON.parse(stats_get(stats, "/status"))

  # Waits until the status listener shows worker `pid` (any worker when nil) running a request in
  # its app (its scoreboard slot is busy from request_start to request_done); returns its entry.
  def wait_until_in_app(stats, pid = nil, timeout = 15)
    wait_for(timeout, "worker #{pid} running a request in its app") do
      status_json(stats)["workers"].find { |w| (pid.nil? || w["pid"] == pid) && w["state"] == "busy" }
    end
  end

  # Asserts that the server logs a line matching pattern, waiting for it: a worker may write it
  # after its answer has gone out.
  # out (all a connection received) is one complete answer with `status` and "Connection: close",
  # then EOF: nothing pipelined behind the request that got it was answered.
  def assert_one_closing_answer(out, status, what)
    assert_match(%r{\AHTTP/1\.1 #{status} }, out, "expected #{status} for #{what}, got #{out[0, 120].inspect}")
    head, body = out.split("\r\n\r\n", 2)
    assert_match(/\r\nConnection: close(\r\n|\z)/i, head)
    assert_equal head[/Content-Length: (\d+)/i, 1].to_i, body.bytesize, "a complete response, then EOF"
    assert_equal 1, out.scan(%r{HTTP/1\.1 \d{3}}).size, "nothing pipelined after it is answered"
    head
  end

  def assert_logged(server, pattern, timeout = 15)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    sleep 0.05 until server.log.match?(pattern) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    assert_match(pattern, server.log)
  end

  # /status once every worker has ticked after `since` (a CLOCK_MONOTONIC time; the scoreboard's
  # heartbeat), and the block, when given, accepts it. A worker publishes some numbers only on its
  # tick (moves, connections; every Worker::TICK_SECONDS): then they are at least as new as `since`.
  def status_after(stats, since, timeout = 15)
    wait_for(timeout, "every worker ticking after the moment waited for") do
      # taken before the request: a worker whose heartbeat is younger than this ticked after `since`
      elapsed_ms = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - since) * 1000
      s = status_json(stats)
      ticked = s["workers"].all? { |w| w["heartbeat_age_ms"] && w["heartbeat_age_ms"] < elapsed_ms }
      s if ticked && (!block_given? || yield(s))
    end
  end

  # /status once nothing is in flight: every worker idle and holding no connection, as published on
  # a tick after `since` (when the clients had their last answers and closed). A request served
  # twice would be counted by then.
  def settled_status(stats, since, timeout = 15)
    status_after(stats, since, timeout) do |s|
      s["totals"]["connections"].zero? && s["workers"].all? { |w| w["state"] == "idle" }
    end
  end

  # What a process holds open (the targets of /proc/PID/fd links).
  def fd_links(pid)
    Dir.children("/proc/#{pid}/fd").filter_map do |fd|
      File.readlink("/proc/#{pid}/fd/#{fd}")
    rescue SystemCallError
      nil
    end
  end

  STALLED_RCVBUF = 16_384 # bytes: a stalled client's receive buffer, so the kernel holds little

  # A GET (and any bytes after it) from a client that then reads nothing.
  def stalled_request(server, path, more: "")
    s = Socket.new(:INET, :STREAM)
    s.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, STALLED_RCVBUF)
    s.connect(Socket.sockaddr_in(server.tcp_port, server.tcp_host))
    s.write("GET #{path} HTTP/1.1\r\nHost: x\r\n\r\n#{more}")
    s
  end

  def alive?(pid)
    Process.kill(0, pid)
    true
  rescue Errno::ESRCH
    false
  end

  # A test's own child left behind (a stopped mold): SIGKILL unless it is gone already.
  def kill_if_alive(pid)
    Process.kill(:KILL, pid) if pid
  rescue Errno::ESRCH
    nil
  end

  def free_port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }

  # Sockets a process holds open (from /proc).
  def socket_fds(pid)
    Dir.children("/proc/#{pid}/fd").count do |fd|
      File.readlink("/proc/#{pid}/fd/#{fd}").start_with?("socket:")
    rescue SystemCallError
      false
    end
  end

  def teardown
    (@servers || []).each do |s|
      s.stop
      unless passed?
        warn "\n--- server log (#{name}) ---\n#{s.log}--- end ---"
      end
      FileUtils.rm_rf(s.dir) if s.dir&.include?("bb-test")
    end
  end
end
