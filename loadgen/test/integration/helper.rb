# frozen_string_literal: true

# Shared by the blackbuck-load integration tests: run the binary with a time
# limit, and small fixture HTTP servers (TCP or UNIX) that count what they see.
# Everything talks to 127.0.0.1 or UNIX sockets; every process started here is
# killed by pid.
require "minitest/autorun"
require "json"
require "socket"
require "tmpdir"
require "timeout"
require "fileutils"
require "open3"
require "zlib"

module LoadgenHelper
  ROOT = File.expand_path("../..", __dir__)
  # BLACKBUCK_LOAD_BIN: run the suite against another build (e.g. a sanitizer build)
  BIN = ENV.fetch("BLACKBUCK_LOAD_BIN", File.join(ROOT, "blackbuck-load"))

  Result = Struct.new(:status, :out, :err) do
    def success? = status&.success?
    def to_s = "exit=#{status&.exitstatus.inspect}\n--- stdout\n#{out}--- stderr\n#{err}"
  end

  # Run blackbuck-load; kill it (by pid) if it outlives `limit` seconds.
  def run_load(*args, limit: 20)
    skip "blackbuck-load not built (run make -C loadgen)" unless File.executable?(BIN)
    out_r, out_w = IO.pipe
    err_r, err_w = IO.pipe
    pid = Process.spawn(BIN, *args.map(&:to_s), out: out_w, err: err_w, in: File::NULL)
    out_w.close
    err_w.close
    out_reader = Thread.new { out_r.read }
    err_reader = Thread.new { err_r.read }
    status = nil
    deadline = Time.now + limit
    until (status = Process.wait2(pid, Process::WNOHANG)&.last)
      if Time.now > deadline
        Process.kill(:KILL, pid)
        status = Process.wait2(pid).last
        flunk "blackbuck-load #{args.join(' ')} did not finish within #{limit}s"
      end
      sleep 0.02
    end
    result = Result.new(status, out_reader.value, err_reader.value)
    refute_match(/Sanitizer|runtime error:/, result.err, result.to_s)
    result
  ensure
    [out_r, err_r].each { |io| io&.close unless io&.closed? }
  end

  # exit: the exit status expected (1 when every request is to fail).
  def run_json(*args, exit: 0, **opts)
    Dir.mktmpdir("bl-json") do |dir|
      path = File.join(dir, "out.json")
      r = run_load("--json", path, *args, **opts)
      assert_equal exit, r.status.exitstatus, r.to_s
      [r, JSON.parse(File.read(path))]
    end
  end

  # Parse the numbers out of the text report.
  def requests_of(out) = out[/^  (\d+) requests in /, 1].to_i

  def socket_errors_of(out)
    m = out.match(/Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/)
    m ? m.captures.map(&:to_i) : [0, 0, 0, 0]
  end

  # wrk's report, line by line (the same check runs on wrk's own output in
  # nginx_test, so it describes wrk and not just us). A stats row is
  # "    %-10s" + fields 8, 10 and 9 wide whose unit hangs into a 2-column
  # gutter, then "%8.2f%".
  TIME_FIELD = /\A *\d+\.\d\d(?:us|ms|s |m |h )\z/
  METRIC_FIELD = /\A *\d+\.\d\d(?:[kMGT] |  )\z/

  def assert_stats_row(line, name, field)
    m = line.match(/\A    #{Regexp.escape(name.ljust(10))}(.{8})(.{10})(.{9})( *\d+\.\d\d)%\n\z/)
    assert m, "bad #{name} row: #{line.inspect}"
    m.captures[0, 3].each { |f| assert_match field, f, line.inspect }
    assert_equal 8, m[4].size
  end

  def assert_wrk_report(out)
    lines = out.lines
    assert_match %r{\ARunning \d+(?:s|m|h|\.\d\d(?:us|ms|s)) test @ http://\S+\n\z}, lines[0], out
    assert_match(/\A  \d+ threads and \d+ connections\n\z/, lines[1], out)
    assert_equal "  Thread Stats   Avg      Stdev     Max   +/- Stdev\n", lines[2], out
    assert_stats_row(lines[3], "Latency", TIME_FIELD)
    assert_stats_row(lines[4], "Req/Sec", METRIC_FIELD)
    i = 5
    if lines[i] == "  Latency Distribution\n"
      %w[50 75 90 99].each_with_index do |p, k|
        assert_match(/\A {5}#{p}% +\d+\.\d\d(?:us|ms|s|m)\n\z/, lines[i + 1 + k], out)
        assert_equal 19, lines[i + 1 + k].size, out # "%7.0f%%" + a 10-wide field
      end
      i += 5
    end
    i += 1 while lines[i] =~ /\A  ( |\d{2}\.\d+%|Connect Distribution)/ && lines[i] !~ /requests in/
    assert_match(/\A  \d+ requests in \d+\.\d\d(?:us|ms|s|m), \d+\.\d\d[KMGT]?B read\n\z/, lines[i], out)
    assert_match(/\ARequests\/sec: +\d+\.\d\d\n\z/, lines[-2], out)
    assert_operator lines[-2].size, :>=, "Requests/sec: ".size + 9 + 1
    assert_match(/\ATransfer\/sec: +\d+\.\d\d[KMGT]?B\n\z/, lines[-1], out)
    assert_operator lines[-1].size, :>=, "Transfer/sec: ".size + 10 + 2
  end

  def free_port
    s = TCPServer.new("127.0.0.1", 0)
    s.addr[1]
  ensure
    s&.close
  end

  # A fixture HTTP server. mode decides each response:
  #   :keepalive  Content-Length, keep-alive
  #   :chunked    chunked body, keep-alive
  #   :close      Content-Length and Connection: close, then close
  #   :eof        no length: the body ends when the server closes (Unicorn)
  #   :silent     reads requests, never answers
  #   :delay      answers after `delay` seconds, keep-alive
  #   :idle_close answers `every` responses per connection, then closes without notice
  #   :status500  500 responses, keep-alive
  #   :routes     by path, keep-alive: /slow... answers after `delay` seconds,
  #               /missing... is a 404, anything else 200 at once; HEAD gets no body
  # Every mode counts requests by request line ("GET /fast") in `by_target`,
  # the request lines each connection carried (`connections_by_target`), and
  # request bodies by CRC-32 (`bodies`).
  class Fixture
    BODY = "hello world\n"
    SEQUENCE_KEPT = 200 # request lines kept in arrival order, for `sequence`
    attr_reader :requests, :connections, :bytes_sent, :last_request, :addr, :by_target, :sequence, :bodies

    def initialize(mode, unix: nil, host: "127.0.0.1", delay: 0.02, every: 3)
      @mode, @delay, @every = mode, delay, every
      @requests = @connections = @bytes_sent = 0
      @by_target = Hash.new(0)
      @bodies = Hash.new(0)
      @sequence = []
      @per_connection = []
      @lock = Mutex.new
      @server = unix ? UNIXServer.new(unix) : TCPServer.new(host, 0)
      authority = host.include?(":") ? "[#{host}]:#{@server.addr[1]}" : "#{host}:#{@server.addr[1]}"
      @addr = unix || authority
      @url = unix ? "http://localhost/" : "http://#{authority}/"
      @clients = []
      @acceptor = Thread.new { accept_loop }
    end

    def url = @url

    def close
      @acceptor.kill
      @server.close
      @lock.synchronize { @clients.each { |c| c.close rescue nil } }
    end

    def response
      case @mode
      when :keepalive, :delay, :idle_close then "HTTP/1.1 200 OK\r\nContent-Length: #{BODY.bytesize}\r\n\r\n#{BODY}"
      when :status500 then "HTTP/1.1 500 Internal Server Error\r\nContent-Length: #{BODY.bytesize}\r\n\r\n#{BODY}"
      when :chunked then "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n world\n\r\n0\r\n\r\n"
      when :close then "HTTP/1.1 200 OK\r\nContent-Length: #{BODY.bytesize}\r\nConnection: close\r\n\r\n#{BODY}"
      when :eof then "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n#{BODY}"
      end
    end

    # :routes: the response to one request line.
    def route(line)
      method, path = line.split(" ", 3)
      sleep @delay if path.start_with?("/slow")
      status = path.start_with?("/missing") ? "404 Not Found" : "200 OK"
      "HTTP/1.1 #{status}\r\nContent-Length: #{BODY.bytesize}\r\n\r\n#{method == 'HEAD' ? '' : BODY}"
    end

    # {"GET /fast" => number of connections that carried only GET /fast, ...};
    # connections that carried several different ones are counted under nil,
    # those that carried none (the start-up probe) not at all.
    def connections_by_target
      @lock.synchronize do
        @per_connection.reject(&:empty?).each_with_object(Hash.new(0)) do |lines, h|
          h[lines.size == 1 ? lines.keys.first : nil] += 1
        end
      end
    end

    private

    def accept_loop
      loop do
        client = @server.accept
        @lock.synchronize do
          @connections += 1
          @clients << client
        end
        Thread.new(client) { |c| serve(c) }
      end
    rescue IOError, Errno::EBADF
      nil
    end

    def serve(client)
      buf = +""
      served = 0
      lines = {}
      @lock.synchronize { @per_connection << lines }
      loop do
        while (req = take_request(buf))
          line = req[/\A[^\r\n]*/].delete_suffix(" HTTP/1.1")
          @lock.synchronize do
            @requests += 1
            @last_request = req
            @by_target[line] += 1
            body_at = req.index("\r\n\r\n") + 4
            @bodies[Zlib.crc32(req.byteslice(body_at..))] += 1 if req.bytesize > body_at
            @sequence << line if @sequence.size < SEQUENCE_KEPT
            lines[line] = true
          end
          next if @mode == :silent
          sleep @delay if @mode == :delay
          data = @mode == :routes ? route(line) : response
          client.write(data)
          @lock.synchronize { @bytes_sent += data.bytesize }
          served += 1
          return if %i[close eof].include?(@mode)
          return if @mode == :idle_close && served == @every
        end
        buf << client.readpartial(65_536)
      end
    rescue EOFError, IOError, SystemCallError
      nil
    ensure
      client.close rescue nil
    end

    # One whole request (head + Content-Length body) off the front of buf.
    def take_request(buf)
      head_end = buf.index("\r\n\r\n") or return nil
      len = buf[0, head_end][/^content-length:\s*(\d+)/i, 1].to_i
      total = head_end + 4 + len
      return nil if buf.bytesize < total
      buf.slice!(0, total)
    end
  end

  def with_fixture(mode, unix: false, **opts)
    Dir.mktmpdir("bl-fix") do |dir|
      fx = Fixture.new(mode, unix: unix ? File.join(dir, "s.sock") : nil, **opts)
      begin
        yield fx
      ensure
        fx.close
      end
    end
  end
end
