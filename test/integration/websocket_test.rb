# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# WebSockets through rack.hijack (full, as Action Cable does, and partial) with a real client,
# Node's `ws`. A hijacked connection belongs to the app: the worker's graceful stop must not
# wait for it, whether the client closed it already or still holds it open.
class WebSocketTest < ServerTest
  NODE_PATH = "/usr/share/nodejs" # Debian's node-ws
  CLIENT = File.join(__dir__, "..", "clients", "ws_echo.js")
  # seconds a stop is waited for: generous for a loaded machine, and far below graceful_timeout
  # (GRACEFUL), which the old code waited whole: a stop that ends within it did not wait for the WebSocket
  STOP_WAIT = 40
  GRACEFUL = 600

  def setup
    skip "node is not installed (bin/setup installs nodejs and node-ws)" unless system("node --version", out: File::NULL, err: File::NULL)
    skip "the ws package is missing (bin/setup installs node-ws)" unless File.exist?(File.join(NODE_PATH, "ws", "package.json"))
    @server = start_server(["-l", "127.0.0.1:0", "--graceful-timeout", GRACEFUL.to_s], app: "websocket.ru")
  end

  def url(path) = "ws://127.0.0.1:#{@server.tcp_port}#{path}"

  def echo(path)
    out, status = Open3.capture2e({ "NODE_PATH" => NODE_PATH }, "node", CLIENT, url(path), "echo")
    assert status.success?, "ws client failed: #{out}"
    assert_equal "echoed", out.lines.first&.strip
    out
  end

  # TERM, and the master's clean exit well before graceful_timeout.
  def stop
    @server.signal(:TERM)
    status = @server.wait_exit(STOP_WAIT)
    assert status&.success?, "server did not exit cleanly within #{STOP_WAIT} s (graceful_timeout #{GRACEFUL} s): " \
                             "#{status.inspect}"
  end

  %w[full partial].each do |kind|
    define_method("test_#{kind}_hijack_echo_then_stop_is_quick") do
      echo("/#{kind}")
      stop
    end

    define_method("test_#{kind}_hijack_still_open_does_not_hold_the_stop") do
      r, w = IO.pipe
      pid = Process.spawn({ "NODE_PATH" => NODE_PATH }, "node", CLIENT, url("/#{kind}"), "hold", out: w, err: w)
      w.close
      lines = []
      Timeout.timeout(15) { lines << r.gets until lines.last&.start_with?("holding") }
      io = @server.tcp
      assert_equal 200, request(io, "GET", "/").status, "the worker serves HTTP while the app holds a WebSocket"
      io.close
      stop
      Timeout.timeout(10) { Process.wait(pid) }
      pid = nil
      assert_match(/closed/, r.read.to_s, "the client sees the socket close when the worker exits")
    ensure
      if pid
        Process.kill(:KILL, pid)
        Process.wait(pid)
      end
      r&.close
    end
  end
end
