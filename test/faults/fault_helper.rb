# frozen_string_literal: true

require_relative "../test_helper"

# The fault-injection suite's client: it never retries, and it accounts for every request it
# sends. Each outcome is one of
#   :ok          a whole 200 answer
#   :status      a whole answer with another status (the status is kept)
#   :eof_new     EOF or reset before any byte of the answer, on a new connection
#   :eof_reused  the same on a connection that had served an answer before (a keep-alive race lost)
#   :partial     EOF, reset or a timeout after part of the answer (mid-response)
#   :refused     the connection was refused (nothing listens)
#   :timeout     no byte of an answer within TIMEOUT
# Clients run in threads against 127.0.0.1 or UNIX sockets until #stop, and for MAX_SECONDS at most.
# A slow reader (a download client) takes its answer at `rate` bytes a second at most, on a small
# receive buffer, so its response is still being written when a stop begins.
class FaultLoad
  TIMEOUT = 20     # seconds a request may take before it counts as :timeout
  MAX_SECONDS = 120 # a load never outlives a hung test
  OUTCOMES = %i[ok status eof_new eof_reused partial refused timeout].freeze
  READ_CHUNK = 65_536 # bytes a read takes at most
  SLOW_RCVBUF = 65_536 # bytes: a slow reader's socket receive buffer (no autotuning)

  Client = Struct.new(:name, :connect, :keepalive, :path, :rate)
  Pace = Struct.new(:rate, :started, :taken) # a slow reader's: bytes a second, since when, bytes so far

  attr_reader :results

  # clients: [[name, -> { a connected socket }, keepalive?, path, rate or nil], ...]
  def initialize(clients)
    @results = Hash.new { |h, k| h[k] = [] } # outcome => [[client, detail], ...]
    @lock = Mutex.new
    @stop = false
    @sent = 0
    @threads = clients.map { |c| Thread.new { run(Client.new(*c)) } }
  end

  def sent = @lock.synchronize { @sent }
  def ok = @lock.synchronize { @results[:ok].size }

  # Waits until n more requests have been answered 200 (the load really flows), or raises.
  def wait_ok(n, timeout: 60)
    target = ok + n
    deadline = now + timeout
    sleep 0.02 until ok >= target || now > deadline
    raise "load stalled: #{ok}/#{target} ok, #{summary}" if ok < target
  end

  def stop
    @stop = true
    @threads.each(&:join)
    self
  end

  # Everything but :ok, as "outcome: n (first details)".
  def failures = @results.reject { |k, _| k == :ok }.transform_values(&:size)

  def summary
    @results.map { |k, v| "#{k}=#{v.size}#{" #{v.first(3).map { |c, d| "#{c}:#{d}" }.join(', ')}" unless k == :ok}" }.join(" ")
  end

  private

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def record(outcome, client, detail = nil)
    @lock.synchronize { @results[outcome] << [client.name, detail] }
  end

  def run(client)
    deadline = now + MAX_SECONDS
    io = nil
    served_on_io = 0
    until @stop || now > deadline
      if io.nil?
        begin
          io = client.connect.call
          io.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, SLOW_RCVBUF) if client.rate
          served_on_io = 0
        rescue Errno::ECONNREFUSED, Errno::ENOENT
          record(:refused, client)
          sleep 0.01
          next
        end
      end
      @lock.synchronize { @sent += 1 }
      outcome, detail, close = exchange(io, client, served_on_io.positive?)
      record(outcome, client, detail)
      served_on_io += 1
      if close || !client.keepalive || outcome != :ok
        io.close
        io = nil
      end
    end
  ensure
    io&.close
  end

  # One request and its answer: [outcome, detail, whether the server closes after it].
  def exchange(io, client, reused)
    io.write("GET #{client.path} HTTP/1.1\r\nHost: x\r\n#{"Connection: close\r\n" unless client.keepalive}\r\n")
    buf = +""
    deadline = now + TIMEOUT
    pace = client.rate && Pace.new(client.rate, now, 0)
    until (head_end = buf.index("\r\n\r\n"))
      chunk = read_some(io, deadline, pace)
      return [buf.empty? ? (reused ? :eof_reused : :eof_new) : :partial, chunk.to_s, true] unless chunk.is_a?(String)

      buf << chunk
    end
    head = buf[0, head_end]
    status = head[/\AHTTP\/1\.1 (\d{3})/, 1].to_i
    len = head[/^content-length: *(\d+)/i, 1]
    return [:partial, "no content-length", true] unless len

    body = buf[(head_end + 4)..]
    while body.bytesize < len.to_i
      chunk = read_some(io, deadline, pace)
      return [:partial, "body #{body.bytesize}/#{len}", true] unless chunk.is_a?(String)

      body << chunk
    end
    close = head.match?(/^connection: *close/i)
    status == 200 ? [:ok, nil, close] : [:status, status, close]
  rescue Errno::EPIPE, Errno::ECONNRESET => e
    [reused ? :eof_reused : :eof_new, e.class.name, true]
  end

  # A chunk, or :eof / :reset / :timeout. pace: a slow reader's (nil: it takes all it can), which
  # waits before each read until what it has taken so far is due at its rate.
  def read_some(io, deadline, pace = nil)
    sleep([pace.started + (pace.taken.to_f / pace.rate) - now, 0].max) if pace
    loop do
      r = io.read_nonblock(READ_CHUNK, exception: false)
      unless r == :wait_readable
        pace.taken += r.bytesize if pace && r
        return r.nil? ? :eof : r
      end

      left = deadline - now
      return :timeout if left <= 0

      io.wait_readable(left)
    end
  rescue Errno::ECONNRESET
    :reset
  end
end

class FaultTest < ServerTest
  DOWNLOAD_BYTES = 10 * 1024 * 1024 # a slow reader's download (the apps' /download?bytes=N)
  DOWNLOAD_RATE = 2_000_000         # bytes a second it takes them at: one download lasts ~5 s

  def download_path(bytes = DOWNLOAD_BYTES) = "/download?bytes=#{bytes}"

  # Keep-alive clients over the UNIX socket, connection-per-request clients over TCP, and slow
  # readers downloading on keep-alive connections (TCP and UNIX in turn), which the apps the suite
  # runs answer at /download.
  def load_on(server, keepalive: 2, fresh: 2, path: "/", downloads: 2)
    clients = Array.new(keepalive) { |i| ["unix-ka-#{i}", -> { server.unix }, true, path] } +
              Array.new(fresh) { |i| ["tcp-#{i}", -> { server.tcp }, false, path] } +
              Array.new(downloads) do |i|
                unix = i.odd? && server.unix_path
                ["#{unix ? 'unix' : 'tcp'}-download-#{i}", unix ? -> { server.unix } : -> { server.tcp }, true,
                 download_path, DOWNLOAD_RATE]
              end
    (@loads ||= []) << FaultLoad.new(clients)
    @loads.last
  end

  def assert_nothing_lost(load, allowed: {})
    failures = load.failures.reject { |k, n| n.zero? || (allowed[k] && n <= allowed[k]) }
    assert_empty failures, "requests lost: #{load.summary}"
  end

  # A line count in the server's log.
  def log_count(server, pattern) = server.log.scan(pattern).size

  def wait_log(server, pattern, count = 1, timeout: 60)
    wait_for(timeout) { log_count(server, pattern) >= count }
  rescue RuntimeError
    flunk "#{pattern.inspect} seen #{log_count(server, pattern)} times, not #{count}, within #{timeout}s"
  end

  def teardown
    (@loads || []).each(&:stop)
    super
  end
end
