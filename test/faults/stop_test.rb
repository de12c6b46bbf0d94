# frozen_string_literal: true

require_relative "fault_helper"
require "json"

# A graceful stop serves connections already waiting in a listen queue instead of letting the
# kernel reset them when the last copy of the listener closes. With --threads and no hand-off, a
# worker whose app threads are all busy stops accepting, so a queue builds up behind it.
class StopFaultTest < FaultTest
  SLOW = 1 # seconds the requests that hold every app thread run

  def test_connections_queued_at_term_are_served
    dir = Dir.mktmpdir("bb-test")
    server = start_server(["-l", "127.0.0.1:0", "--threads", "2", "--handoff-after", "0",
                           "--stats-listen", "unix:#{dir}/status.sock"], app: "handoff.ru", workers: 2, dir: dir)
    busy = Array.new(4) do
      s = server.tcp
      s.write("GET /?sleep=#{SLOW} HTTP/1.1\r\nHost: x\r\n\r\n")
      s
    end
    queued = Array.new(5) do |i|
      s = server.tcp
      s.write("GET /?id=q#{i} HTTP/1.1\r\nHost: x\r\n\r\n")
      s
    end
    # every app thread is busy and the five wait in the listen queue
    wait_for(10) { JSON.parse(stats_get("#{dir}/status.sock", "/status"))["totals"]["queued"] == 5 }
    server.signal(:TERM)
    assert_equal [200] * 4, busy.map { |c| read_response(c, timeout: 10)&.status }
    answers = queued.map { |c| read_response(c, timeout: 10) }
    assert_equal [200] * 5, answers.map { |r| r&.status }, "the queued connections are served, not reset"
    assert_equal %w[q0 q1 q2 q3 q4], answers.map { |r| r.body[/ id=(\w+)/, 1] }
    assert_equal ["close"] * 5, answers.map { |r| r["connection"] }, "a stopping server closes them after"
    assert_equal 0, server.wait_exit(15)&.exitstatus
  ensure
    [*busy, *queued].each { |io| io&.close }
  end

  # TERM under load, connection-per-request clients on TCP: every connection the kernel queued
  # before the listeners closed is answered; what comes after is refused (a balancer retries it).
  # One kind of loss is the kernel's: a connection whose handshake completes in the instant between
  # a worker's last accept and its close of the listener is reset; a client connecting in a loop
  # can meet that instant once at most.
  [1, 4].each do |threads|
    define_method("test_term_under_load_serves_or_refuses_threads_#{threads}") do
      dir = Dir.mktmpdir("bb-test")
      server = start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--threads", threads.to_s],
                            app: "faults.ru", workers: 2, dir: dir)
      load = load_on(server, keepalive: 2, fresh: 3)
      load.wait_ok(300)
      server.signal(:TERM)
      assert server.wait_exit(30)&.success?
      load.stop
      assert_nothing_lost(load, allowed: { refused: Float::INFINITY, eof_new: 3 })
      assert_empty load.results[:eof_new].reject { |client, _| client.start_with?("tcp-") }
    end
  end
end
