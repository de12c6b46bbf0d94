# frozen_string_literal: true

require_relative "../test_helper"
require "net/http"
require "json"
require "open3"
require "stringio"

# Real clients: curl, Net::HTTP, and nginx proxying to the UNIX socket with upstream keep-alive.
class RealClientsTest < ServerTest
  def setup
    @server = start_both(app: "kitchen.ru")
  end

  def test_curl_over_tcp_and_unix
    skip "curl is not installed" unless system("command -v curl > /dev/null")
    out, status = Open3.capture2("curl", "-sS", "--max-time", "10", "http://127.0.0.1:#{@server.tcp_port}/hello")
    assert status.success?
    assert_equal "hello world\n", out
    out, status = Open3.capture2("curl", "-sS", "--max-time", "10", "--unix-socket", @server.unix_path,
                                 "-d", "posted", "http://localhost/echo")
    assert status.success?
    assert_equal "posted", out
    out, status = Open3.capture2("curl", "-sS", "--max-time", "10", "-T", "-", "-H", "Transfer-Encoding: chunked",
                                 "http://127.0.0.1:#{@server.tcp_port}/echo", stdin_data: "streamed upload")
    assert status.success?
    assert_equal "streamed upload", out
  end

  def test_net_http_keepalive_session
    log = StringIO.new
    http = Net::HTTP.new("127.0.0.1", @server.tcp_port)
    http.read_timeout = 10
    http.set_debug_output(log) # says "opening connection" each time it connects
    http.start do
      5.times { assert_equal 200, http.get("/env").code.to_i }
      assert_equal 1, log.string.scan("opening connection").size, "Net::HTTP reused one connection for all five requests"
      res = http.post("/echo", "x" * 10_000, "Content-Type" => "application/octet-stream")
      assert_equal 10_000, res.body.bytesize
      res = http.get("/each")
      assert_equal "abbccc", res.body
    end
  end

  def test_nginx_proxy_with_upstream_keepalive
    skip "nginx is not installed" unless NginxProxy.available?
    skip "no /proc/net/unix" unless File.readable?("/proc/net/unix")
    nginx = NginxProxy.new("unix:#{@server.unix_path}")
    seen = Array.new(20) do
      Net::HTTP.start("127.0.0.1", nginx.port) do |http| # a new client connection each time
        res = http.get("/env")
        assert_equal 200, res.code.to_i
        assert_equal "127.0.0.1", JSON.parse(res.body)["HTTP_X_FORWARDED_FOR"]
      end
      ends = server_ends(@server.unix_path)
      refute_empty ends, "the connection that served it is still open"
      ends
    end
    assert_operator seen.flatten.uniq.size, :<=, 2, "nginx kept its upstream connection alive across client connections"
    Net::HTTP.start("127.0.0.1", nginx.port) do |http|
      assert_equal "abbccc", http.get("/each").body, "chunked response through nginx"
      assert_equal "y" * 50_000, http.post("/echo", "y" * 50_000).body
    end
  ensure
    nginx&.stop
  end

  # The server's ends of the connections open to its UNIX socket at path, by inode: /proc/net/unix
  # lists an accepted socket (state 03, connected) under its listener's path, a client's without one.
  def server_ends(path)
    File.readlines("/proc/net/unix").drop(1).filter_map do |line|
      _, _, _, _, _, state, inode, name = line.split
      inode if name == path && state == "03"
    end
  end
end
