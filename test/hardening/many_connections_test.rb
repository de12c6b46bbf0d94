# frozen_string_literal: true

require_relative "../test_helper"

# Thousands of open connections, and what happens past max_connections: a worker at its cap
# stops accepting and resumes as connections close, so every client is served in the end.
class ManyConnectionsTest < ServerTest
  CONNS = 2000
  HANDOFF = 2 # sockets: both ends of the generation's hand-off pair (handoff_after), in every worker

  def setup
    soft, hard = Process.getrlimit(:NOFILE)
    skip "RLIMIT_NOFILE hard limit is #{hard}; these tests need about 4,500 descriptors" if hard < 4500
    Process.setrlimit(:NOFILE, hard, hard) if soft < hard
  end

  # 2,000 TCP connections, all open at once, then 2,000 UNIX ones, to one server with two
  # workers (default max_connections 1024 each: 2,048 in all). Every one gets its 200.
  def test_2000_tcp_then_2000_unix_connections_open_at_once
    # A backlog that holds all 2,000 connects even if the workers are slow to accept: once a
    # UNIX listen queue is full, connect(2) fails with EAGAIN and the (non-blocking) client
    # socket is left unconnected, which Ruby only reports later as ENOTCONN on write.
    server = start_both(["--backlog", "4096"], app: "kitchen.ru", workers: 2)
    %i[tcp unix].each do |transport|
      socks = []
      begin
        CONNS.times { socks << (transport == :tcp ? server.tcp : server.unix) }
        problems = []
        socks.each_with_index do |s, i|
          s.write("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        rescue SystemCallError => e
          problems << "#{transport} ##{i} write: #{e.class}"
        end
        deadline = now + 60
        socks.each_with_index do |s, i|
          res = read_response(s, timeout: [deadline - now, 1].max)
          problems << "#{transport} ##{i}: #{res ? res.status : 'no response'}" unless res&.status == 200
        rescue SystemCallError, IOError, Timeout::Error => e
          problems << "#{transport} ##{i} read: #{e.class}"
        end
        assert_empty problems, "#{problems.size} of #{CONNS} #{transport} connections failed, e.g. " \
                               "#{problems.first(5).join('; ')}"
        # Both workers hold connections, neither more than its cap (+ the 2 listeners, the hand-off pair).
        held = server.worker_pids.map { |pid| socket_fds(pid) }
        assert_operator held.sum, :>=, CONNS, "workers' sockets: #{held.inspect}"
        held.each { |n| assert_operator n, :<=, 1024 + 2 + HANDOFF, "a worker went past max_connections: #{held.inspect}" }
        # all still open and usable: a second request on each of the first 50
        socks.first(50).each { |s| assert_equal 200, request(s, "GET", "/hello").status }
      ensure
        socks.each(&:close)
      end
    end
    refute server.exited?
    assert_empty server.log.scan(/ERROR|EMFILE/), "no accept errors"
  end

  # One worker capped at 50 connections, 200 clients at once, each sending Connection: close.
  def test_over_the_cap_with_connection_close_everyone_is_served
    server = start_server(["-l", "127.0.0.1:0", "--max-connections", "50"], app: "kitchen.ru")
    assert_all_served(server, 200, "Connection: close\r\n")
  end

  # The same with keep-alive clients that hold their connection after the answer: the idle
  # ones are closed after keepalive_timeout, which makes room for the ones still waiting.
  def test_over_the_cap_with_idle_keepalive_clients_everyone_is_served
    server = start_server(["-l", "127.0.0.1:0", "--max-connections", "50", "--keepalive-timeout", "1"],
                          app: "kitchen.ru")
    assert_all_served(server, 200, "")
  end

  private

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def assert_all_served(server, count, extra)
    socks = Array.new(count) { server.tcp }
    socks.each { |s| s.write("GET /hello HTTP/1.1\r\nHost: x\r\n#{extra}\r\n") }
    pending = socks.dup
    results = {}
    deadline = now + 45
    worker = server.worker_pids.first
    peak = 0
    until pending.empty? || now > deadline
      peak = [peak, socket_fds(worker)].max
      ready, = IO.select(pending, nil, nil, 1)
      (ready || []).each do |s|
        results[s] = read_response(s, timeout: 5)
        pending.delete(s)
      end
    end
    assert_empty pending, "#{pending.size} of #{count} clients never got an answer"
    statuses = results.values.map { |r| r&.status }
    assert_equal [200] * count, statuses
    assert_operator peak, :<=, 50 + 1 + HANDOFF,
                    "the worker held more than --max-connections 50 (+ its listener, the hand-off pair)"
  ensure
    socks&.each(&:close)
  end
end
