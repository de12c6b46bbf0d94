# frozen_string_literal: true

require_relative "../test_helper"

# The app is wrapped in Rack::Lint: any violation of the Rack spec by the server's env,
# rack.input or response handling raises inside Lint and turns into a 500 here. Runs under
# Rack 3 (default Gemfile) and Rack 2.2 (rake test:rack2).
class RackLintTest < ServerTest
  def setup
    @server = start_both(["--body-buffer", "1024"], app: "lint.ru")
  end

  def test_requests_pass_lint
    io = @server.tcp
    assert_equal "lint ok\n", request(io, "GET", "/?q=1").body
    assert_equal "posted", request(io, "POST", "/echo", body: "posted").body
    big = "b" * 5000 # spilled to a tempfile: still a valid rack.input
    assert_equal big, request(io, "POST", "/echo", body: big).body
    assert_equal "ab", request(io, "GET", "/each").body
    res = request(io, "HEAD", "/head")
    assert_equal 200, res.status
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert_equal "abc", read_response(io).body
    res = request(io, "GET", "/", version: "1.0")
    assert_equal 200, res.status
    refute_match(/Rack::Lint::LintError|app error/, @server.log)
  ensure
    io&.close
  end
end
