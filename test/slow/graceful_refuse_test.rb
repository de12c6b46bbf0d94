# frozen_string_literal: true

require_relative "../test_helper"
require "io/wait"

# Issue 22: during a graceful stop (TERM) a new connection waited in the listen queue for a worker
# busy in a slow request, though docs/SIGNALS.md said the server stops accepting at once. Now the
# master's stop makes a worker whose app runs close its listeners at once (the queued connections
# taken first, and served), so once every copy is closed a new TCP connection is refused (a load
# balancer retries elsewhere) while the request in flight finishes.
class GracefulRefuseTest < ServerTest
  def start_gated(args = [])
    gates = Dir.mktmpdir("bb-test")
    @gates = gates
    start_both(["--stats-listen", "unix:#{gates}/status.sock", *args], app: "gate.ru", env: { "BB_GATE_DIR" => gates })
  end

  def open_gate(name) = File.write(File.join(@gates, name), "")

  def teardown
    super
    FileUtils.rm_rf(@gates) if @gates
  end

  def test_term_refuses_new_connections_while_a_busy_worker_finishes_its_request
    server = start_gated
    slow = server.tcp
    slow.write("GET /gate?name=slow HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app("#{@gates}/status.sock")
    # In the listen queue when the stop begins (the one worker is in its app): taken, then served.
    queued = Array.new(3) { server.tcp.tap { |s| s.write("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n") } }
    server.signal(:TERM)
    # Connected while the listeners close: the kernel may have completed a handshake that no accept
    # will ever see (the last drain came first, or, with TCP_DEFER_ACCEPT, the request's bytes came
    # after it); such a connection is reset before any byte, which a balancer retries like a refusal.
    racing = []
    wait_for(10, "a new connection refused while the worker's request runs") do
      s = Socket.tcp(server.tcp_host, server.tcp_port, connect_timeout: 2)
      s.write("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
      racing << s
      false
    rescue Errno::ECONNREFUSED
      true
    end
    assert_raises(Errno::ECONNREFUSED, "refused for good") { TCPSocket.new(server.tcp_host, server.tcp_port).close }
    err = assert_raises(SystemCallError) { UNIXSocket.new(server.unix_path).close }
    assert_includes [Errno::ENOENT, Errno::ECONNREFUSED], err.class
    refute slow.wait_readable(0), "the slow request is still running: the refusal did not wait for it"
    refute server.exited?

    open_gate("slow")
    res = read_response(slow)
    assert_equal 200, res&.status
    assert_equal "gate slow opened\n", res.body
    queued.each_with_index do |s, i|
      r = read_response(s)
      assert_equal 200, r&.status, "connection #{i + 1} of #{queued.size}, queued before the stop, was not answered"
    end
    racing.each do |s|
      got = begin
        s.read
      rescue Errno::ECONNRESET
        ""
      end
      assert(got.empty? || got.start_with?("HTTP/1.1 200 "), "a connection made as the listeners closed: answered " \
                                                             "whole or reset before any byte, got #{got[0, 80].inspect}")
    end
    assert server.wait_exit(15)&.success?, "the master exits 0 once the request is done"
  ensure
    slow&.close
    queued&.each(&:close)
    racing&.each(&:close)
  end

  # With app threads the loop is free while the app runs: it stops accepting at once as before.
  def test_with_app_threads_too
    server = start_gated(["--threads", "2"])
    slow = server.tcp
    slow.write("GET /gate?name=slow HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app("#{@gates}/status.sock")
    server.signal(:TERM)
    wait_for(10, "a new connection refused") do
      TCPSocket.new(server.tcp_host, server.tcp_port).close
      false
    rescue Errno::ECONNREFUSED
      true
    end
    open_gate("slow")
    assert_equal 200, read_response(slow)&.status
    assert server.wait_exit(15)&.success?
  ensure
    slow&.close
  end
end
