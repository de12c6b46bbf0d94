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
class FaultLoad
  TIMEOUT = 20     # seconds a request may take before it counts as :timeout
  MAX_SECONDS = 120 # a load never outlives a hung test
  OUTCOMES = %i[ok status eof_new eof_reused partial refused timeout].freeze

  Client = Struct.new(:name, :connect, :keepalive, :path)

  attr_reader :results

  # clients: [[name, -> { a connected socket }, keepalive?, path], ...]
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
    until (head_end = buf.index("\r\n\r\n"))
      chunk = read_some(io, deadline)
      return [buf.empty? ? (reused ? :eof_reused : :eof_new) : :partial, chunk.to_s, true] unless chunk.is_a?(String)

      buf << chunk
    end
    head = buf[0, head_end]
    status = head[/\AHTTP\/1\.1 (\d{3})/, 1].to_i
    len = head[/^content-length: *(\d+)/i, 1]
    return [:partial, "no content-length", true] unless len

    body = buf[(head_end + 4)..]
    while body.bytesize < len.to_i
      chunk = read_some(io, deadline)
      return [:partial, "body #{body.bytesize}/#{len}", true] unless chunk.is_a?(String)

      body << chunk
    end
    close = head.match?(/^connection: *close/i)
    status == 200 ? [:ok, nil, close] : [:status, status, close]
  rescue Errno::EPIPE, Errno::ECONNRESET => e
    [reused ? :eof_reused : :eof_new, e.class.name, true]
  end

  # A chunk, or :eof / :reset / :timeout.
  def read_some(io, deadline)
    loop do
      r = io.read_nonblock(65_536, exception: false)
      return r.nil? ? :eof : r unless r == :wait_readable

      left = deadline - now
      return :timeout if left <= 0

      io.wait_readable(left)
    end
  rescue Errno::ECONNRESET
    :reset
  end
end

class FaultTest < ServerTest
  # Keep-alive clients over the UNIX socket and connection-per-request clients over TCP.
  def load_on(server, keepalive: 2, fresh: 2, path: "/")
    clients = Array.new(keepalive) { |i| ["unix-ka-#{i}", -> { server.unix }, true, path] } +
              Array.new(fresh) { |i| ["tcp-#{i}", -> { server.tcp }, false, path] }
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
