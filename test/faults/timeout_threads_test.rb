# frozen_string_literal: true

require_relative "fault_helper"

# Issue 32: with app threads, a request that ignores its timeout notice (code rescuing Exception, a
# C call holding the GVL) has its worker killed RequestTimeouts::KILL_GRACE seconds later, and with it
# went every keep-alive connection the worker held: their clients' next requests found the socket
# reset. The worker now retires when the notice is sent: its idle connections move to a sibling at
# once, its listeners close, and the KILL takes only the request that would not stop.
class TimeoutThreadsTest < ServerTest
  WANTED = 4 # connections of one worker: one for the stubborn request, the others idle

  def pid_of(io) = Integer(request(io, "GET", "/overlap?t=0").body[/pid=(\d+)/, 1])

  def test_the_worker_of_a_stubborn_request_moves_its_idle_connections_before_the_kill
    server = start_server(["-l", "127.0.0.1:0", "-t", "1", "--threads", "2"], app: "kitchen.ru", workers: 2)
    by_pid = Hash.new { |h, k| h[k] = [] }
    (@conns = []).tap do |conns|
      40.times do
        io = server.tcp
        conns << io
        by_pid[pid_of(io)] << io
        break if by_pid.values.any? { |l| l.size >= WANTED }
      end
    end
    pid, ios = by_pid.find { |_, l| l.size >= WANTED }
    refute_nil pid, "no worker got #{WANTED} of 40 connections: #{by_pid.transform_values(&:size)}"
    stuck, *idle = ios
    stuck.write("GET /stubborn HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_logged(server, %r{\(pid #{pid}\) timeout: GET /stubborn}, 30)
    wait_for(60, "worker #{pid} gone (killed KILL_GRACE s after the notice)") { !alive?(pid) }
    assert_match(/\(pid #{pid}\) did not stop after the timeout; killing it/, server.log)
    idle.each_with_index do |io, i|
      res = begin
        request(io, "GET", "/hello")
      rescue Errno::ECONNRESET, EOFError, Errno::EPIPE => e
        e
      end
      assert_equal 200, res.respond_to?(:status) ? res.status : res,
                   "idle keep-alive connection #{i} of the killed worker answers (moved to its sibling):\n#{server.log}"
    end
  ensure
    @conns&.each(&:close)
  end
end
