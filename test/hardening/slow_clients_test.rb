# frozen_string_literal: true

require_relative "../test_helper"

# Slow clients never hold a worker: while each kind of slow client is connected, a normal
# request on a fresh connection is answered while they are still there (one worker, so a held
# worker would show: it would answer only once their deadline let it go), and the slow client is
# answered 408 or dropped once its deadline passes, while it is still sending. Every check waits for
# a state; the only times asserted are lower bounds (a deadline not fired early), which a loaded
# machine cannot break.
class SlowClientsHardeningTest < ServerTest
  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  SENDING = 60 # seconds a slow client goes on sending at most: far past every deadline below

  # 100 connections each trickle a byte of a never-ending head every 200 ms, until answered.
  def test_slowloris_100_connections_get_408_after_the_header_timeout
    server = start_server(["-l", "127.0.0.1:0", "--header-timeout", "2"], app: "kitchen.ru")
    worker = server.worker_pids.first
    idle_fds = socket_fds(worker)
    head = "GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: "
    socks = Array.new(100) { server.tcp }
    answered = {} # socket => time its answer became readable
    started = now
    trickler = Thread.new do
      i = 0
      until answered.size == socks.size || now - started > SENDING
        socks.each do |s|
          next if answered.key?(s)

          if s.wait_readable(0) # the server answered: stop writing (a write now would be reset)
            answered[s] = now
            next
          end
          s.write_nonblock(i < head.bytesize ? head.byteslice(i) : "s", exception: false) # the head never ends
        rescue Errno::EPIPE, Errno::ECONNRESET
          answered[s] ||= now
        end
        i += 1
        sleep 0.2
      end
    end

    wait_for(30, "the worker holding the 100 connections") { socket_fds(worker) >= idle_fds + 100 }
    # (none answered yet: an answer, or the close after it, makes a socket readable)
    assert_fresh_request_served(server, behind: "100 slowloris clients", held: -> { socks.none? { |s| s.wait_readable(0) } })
    trickler.join(SENDING + 5)
    # every one was answered while it was still trickling: the deadline counts from the start of the
    # head, not from its last byte (such a deadline would never fire while bytes keep coming)
    assert_equal socks.size, answered.size, "the trickling clients were still not answered after #{SENDING} s"

    socks.each_with_index do |s, i|
      out = read_all(s)
      assert_match(%r{\AHTTP/1\.1 408 }, out, "slowloris client #{i}")
      assert_match(/\r\nConnection: close\r\n/i, out)
      assert closed_by_peer?(s, timeout: 5), "slowloris client #{i} is closed after its 408"
      waited = answered[s] - started
      assert_operator waited, :>=, 1.5, "client #{i} answered after #{waited.round(2)} s, before the 2 s deadline"
    end
    assert_fresh_request_served(server)
  ensure
    trickler&.kill
    socks&.each(&:close)
  end

  # A body at ~100 bytes/s: min_body_rate 1024 applies after the 10 s grace, so 408 then,
  # although bytes keep arriving (body_timeout, the gap limit, never fires).
  def test_slow_body_below_min_body_rate_gets_408_after_the_grace_period
    server = start_server(["-l", "127.0.0.1:0", "--min-body-rate", "1024", "--body-timeout", "5"], app: "kitchen.ru")
    io = server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    started = now
    sent = 0
    answered = false
    writer = Thread.new do # until answered (or SENDING): the body never completes (100000 bytes)
      until now - started > SENDING
        break answered = true if io.wait_readable(0)

        sent += io.write_nonblock("b" * 10, exception: false).then { |n| n.is_a?(Integer) ? n : 0 }
        sleep 0.1
      end
    rescue Errno::EPIPE, Errno::ECONNRESET
      answered = true
    end
    writing = -> { io.wait_readable(0).nil? } # not answered yet: still sending
    assert_fresh_request_served(server, behind: "a slow body", held: writing)
    wait_for(30, "300 body bytes sent") { sent >= 300 } # well into the grace period, still sending
    assert_fresh_request_served(server, behind: "a slow body", held: writing)
    writer.join(SENDING + 5)
    answered_after = now - started
    assert answered, "answered while it was still sending: the rate applies although bytes keep coming"
    out = read_all(io)
    assert_match(%r{\AHTTP/1\.1 408 }, out, "a body at ~100 B/s with --min-body-rate 1024 after #{answered_after.round(1)} s")
    assert_match(/\r\nConnection: close\r\n/i, out)
    assert closed_by_peer?(io, timeout: 5), "closed after the 408"
    assert_operator answered_after, :>=, 9.5, "408 came before the 10 s grace period"
    assert_fresh_request_served(server)
  ensure
    writer&.kill
    io&.close
  end

  # A client asks for 20 MB and never reads: the worker queues the rest, serves others, and
  # drops the client once write_timeout passes.
  def test_reader_that_never_reads_is_dropped_after_the_write_timeout
    server = start_server(["-l", "127.0.0.1:0", "--write-timeout", "2"], app: "kitchen.ru")
    worker = server.worker_pids.first
    idle_fds = socket_fds(worker)
    io = server.tcp
    io.write("GET /big?n=20000000 HTTP/1.1\r\nHost: x\r\n\r\n")
    started = now
    busy_fds = wait_for(15, "the worker holding the client") { (n = socket_fds(worker)) > idle_fds && n }
    assert_fresh_request_served(server, behind: "a reader that never reads", held: -> { socket_fds(worker) >= busy_fds })

    # Dropped: the worker closes the socket (its fd count falls back).
    wait_for(30, "the worker dropping the non-reading client") { socket_fds(worker) < busy_fds }
    dropped_at = now - started
    assert_operator dropped_at, :>=, 1.5, "dropped after #{dropped_at.round(2)} s, before the 2 s write timeout"

    got = read_all(io, timeout: 20).bytesize
    assert_operator got, :<, 20_000_000, "the client was dropped, so it cannot have the whole body"
    assert_fresh_request_served(server)
  ensure
    io&.close
  end

  # write_timeout is documented as "how long a client may stop reading a response": a client
  # that reads a large response steadily, never pausing for long, must get all of it even
  # when the whole transfer takes longer than write_timeout.
  def test_steady_slow_reader_is_not_cut_off_by_the_write_timeout
    server = start_server(["-l", "127.0.0.1:0", "--write-timeout", "2"], app: "kitchen.ru")
    io = server.tcp
    io.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, 65_536)
    n = 20_000_000
    io.write("GET /big?n=#{n} HTTP/1.1\r\nHost: x\r\n\r\n")
    got = 0
    head = +""
    started = now
    Timeout.timeout(30) do
      while got < n
        data = io.readpartial(65_536)
        if head.include?("\r\n\r\n")
          got += data.bytesize
        else
          head << data
          got = head.split("\r\n\r\n", 2)[1].to_s.bytesize if head.include?("\r\n\r\n")
        end
        sleep 0.02 # at most ~3 MB/s: several seconds for the whole body, never idle for 2 s
      end
    end
    assert_equal n, got
  rescue EOFError, Errno::ECONNRESET
    if got < n
      flunk "write_timeout cut off a steady reader: GET /big?n=#{n} with --write-timeout 2, read " \
            "64 KiB every 20 ms, ended after #{(now - started).round(1)} s with #{got} of #{n} body bytes " \
            "(the WRITE deadline must move with every flush that makes progress)"
    end
  ensure
    io&.close
  end
end
