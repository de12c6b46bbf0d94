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

  # Request-target, Host and version edge cases: what the server accepts gives an env Lint
  # accepts (HTTP_HOST, SERVER_NAME/PORT, PATH_INFO without '#'); the rest is a 400, never an
  # env that makes Lint raise (a 500).
  def test_target_host_and_version_edge_cases_pass_lint_or_get_400
    accepted = ["GET http://a.example/?q=1 HTTP/1.1\r\nHost: b.example\r\n\r\n",
                "GET http://a.example HTTP/1.1\r\nHost: b.example\r\n\r\n",
                "GET https://[::1]:8443?x HTTP/1.1\r\nHost: b\r\n\r\n",
                "GET /a#frag HTTP/1.1\r\nHost: x\r\n\r\n",
                "GET /a?b#frag HTTP/1.1\r\nHost: x\r\n\r\n",
                "GET / HTTP/1.2\r\nHost: x\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: %41.example:0080\r\n\r\n",
                "GET / HTTP/1.1\r\nHost:\r\n\r\n"]
    rejected = ["foo:abc", "a:1:2", "a:", "a:65536", "a:99999999999", ":80", "[::1", "[::1]x", "[::1]:",
                "[fe80::1%25eth0]", "[v1.x]", "[1::2::3]", "a%zz"].map { |h| "GET / HTTP/1.1\r\nHost: #{h}\r\n\r\n" }
    rejected << "GET http://a:b/ HTTP/1.1\r\nHost: x\r\n\r\n"
    accepted.each do |req|
      out = raw(@server, req.sub("\r\n\r\n", "\r\nConnection: close\r\n\r\n"))
      # Rack 2's Lint wraps the body (no to_ary): it arrives chunked there
      assert_match %r{\AHTTP/1\.1 200 .*\r\n\r\n(8\r\n)?lint ok\n(\r\n0\r\n\r\n)?\z}m, out, req.inspect
    end
    rejected.each { |req| assert_match %r{\AHTTP/1\.1 400 }, raw(@server, req), req.inspect }
    refute_match(/Rack::Lint::LintError|app error/, @server.log)
  end
end
