# frozen_string_literal: true

require "socket"

# The fault-injection suite's client: it never retries, and it accounts for every request it
# sends. Each outcome is one of
#   :ok          a whole 200 answer
#   :status      a whole answer with another status (the status is kept)
#   :eof_new     EOF or reset before any byte of the answer, on a new connection
#   :eof_reused  the same on a connection that had served an answer before (a keep-alive race lost)
#   :partial     EOF, reset or a timeout after part of the answer (mid-response)
#   :refused     the connection was refused (nothing listens)
#   :timeout     no byte of an answer within TIMEOUT
# Clients run in threads against 127.0.0.1 or UNIX sockets until #stop, and for max_seconds at most.
# A slow reader (a download client) takes its answer at `rate` bytes a second at most, on a small
# receive buffer, so its response is still being written when a stop begins; an upload client sends
# a body with each request (POST). Each request that is not :ok is kept with what the soak
# (soak/faults.rb) needs to say why: [client, detail, sent at, failed at (CLOCK_MONOTONIC), the pid
# of the worker that was answering it (its head came: x-worker-pid) or else that answered the
# connection's previous request, or nil; when the connection's previous request was sent, or nil].
# Used by test/faults (fault_helper.rb) and the fault soak.
class FaultLoad
  TIMEOUT = 20     # seconds a request may take before it counts as :timeout
  MAX_SECONDS = 120 # a load never outlives a hung test (unless told otherwise: the soak)
  OUTCOMES = %i[ok status eof_new eof_reused partial refused timeout].freeze
  READ_CHUNK = 65_536 # bytes a read takes at most
  SLOW_RCVBUF = 65_536 # bytes: a slow reader's socket receive buffer (no autotuning)

  Client = Struct.new(:name, :connect, :keepalive, :path, :rate, :body)
  Pace = Struct.new(:rate, :started, :taken) # a slow reader's: bytes a second, since when, bytes so far

  attr_reader :results

  # clients: [[name, -> { a connected socket }, keepalive?, path, rate or nil, upload body or nil], ...]
  def initialize(clients, max_seconds: MAX_SECONDS)
    @results = Hash.new { |h, k| h[k] = [] } # outcome => [[client, detail, sent at, failed at, pid, previous sent at], ...] (not :ok)
    @ok = 0
    @lock = Mutex.new
    @stop = false
    @sent = 0
    @max_seconds = max_seconds
    @threads = clients.map { |c| Thread.new { run(Client.new(*c)) } }
  end

  def sent = @lock.synchronize { @sent }
  def ok = @lock.synchronize { @ok }

  # Waits until n more requests have been answered 200 (the load really flows), or raises.
  def wait_ok(n, timeout: 60)
    target = ok + n
    deadline = now + timeout
    sleep 0.02 until ok >= target || now > deadline
    raise "load stalled: #{ok}/#{target} ok, #{summary}" if ok < target
  end

  # Stops every client. A slow reader mid-way through a download leaves it there (the request is
  # neither ok nor lost, and not counted as sent), so a stop costs no more than one read's pace.
  def stop
    @stop = true
    @threads.each(&:join)
    self
  end

  # Everything but :ok, as outcome => n.
  def failures = @results.transform_values(&:size)

  def summary
    "ok=#{ok} " + @results.map { |k, v| "#{k}=#{v.size} #{v.first(3).map { |c, d| "#{c}:#{d}" }.join(', ')}" }.join(" ")
  end

  private

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def record(outcome, client, detail = nil, sent_at = now, pid = nil, previous = nil)
    @lock.synchronize do
      next @ok += 1 if outcome == :ok

      @results[outcome] << [client.name, detail, sent_at, now, pid, previous]
    end
  end

  def run(client)
    deadline = now + @max_seconds
    io = nil
    served_on_io = 0
    pid = nil # of the worker that answered on io last
    previous = nil # when the request before on io was sent
    until @stop || now > deadline
      if io.nil?
        begin
          io = client.connect.call
          io.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, SLOW_RCVBUF) if client.rate
          served_on_io = 0
          pid = previous = nil
        rescue Errno::ECONNREFUSED, Errno::ENOENT
          record(:refused, client)
          sleep 0.01
          next
        end
      end
      @lock.synchronize { @sent += 1 }
      sent_at = now
      outcome, detail, close, answered_by = exchange(io, client, served_on_io.positive?)
      if outcome == :abandoned
        @lock.synchronize { @sent -= 1 }
        break
      end
      record(outcome, client, detail, sent_at, answered_by || pid, previous)
      pid = answered_by
      previous = sent_at
      served_on_io += 1
      if close || !client.keepalive || outcome != :ok
        io.close
        io = nil
      end
    end
  ensure
    io&.close
  end

  # One request and its answer: [outcome, detail, whether the server closes after it, the pid the
  # answer names (x-worker-pid) or nil].
  def exchange(io, client, reused)
    head = "#{client.body ? 'POST' : 'GET'} #{client.path} HTTP/1.1\r\nHost: x\r\n" \
           "#{"Connection: close\r\n" unless client.keepalive}" \
           "#{"Content-Length: #{client.body.bytesize}\r\n" if client.body}\r\n"
    client.body ? io.write(head, client.body) : io.write(head)
    buf = +""
    deadline = now + TIMEOUT
    pace = client.rate && Pace.new(client.rate, now, 0)
    until (head_end = buf.index("\r\n\r\n"))
      chunk = read_some(io, deadline, pace)
      next buf << chunk if chunk.is_a?(String)
      return [:timeout, nil, true] if chunk == :timeout && buf.empty?

      return [buf.empty? ? (reused ? :eof_reused : :eof_new) : :partial, chunk.to_s, true]
    end
    head = buf[0, head_end]
    status = head[/\AHTTP\/1\.1 (\d{3})/, 1].to_i
    pid = head[/^x-worker-pid: *(\d+)/i, 1]&.to_i
    len = head[/^content-length: *(\d+)/i, 1]
    return [:partial, "no content-length", true, pid] unless len

    taken = buf.bytesize - head_end - 4 # (counted, not kept: a download is 10 MiB)
    while taken < len.to_i
      return [:abandoned, nil, true, pid] if @stop && pace

      chunk = read_some(io, deadline, pace)
      return [:partial, "body #{taken}/#{len} #{chunk}", true, pid] unless chunk.is_a?(String)

      taken += chunk.bytesize
    end
    close = head.match?(/^connection: *close/i)
    status == 200 ? [:ok, nil, close, pid] : [:status, status, close, pid]
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
