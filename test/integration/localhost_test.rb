# frozen_string_literal: true

require_relative "../test_helper"

# `-l localhost:PORT` (and Rails' default, `rails server -u blackbuck`) serves on both loopback
# addresses on one port, as Puma does, whether or not /etc/hosts says "::1 localhost" (Debian's
# images and many containers do not; then localhost was 127.0.0.1 alone, and a browser or curl
# that tries ::1 first was refused). Issue 22, item 9.
class LocalhostTest < ServerTest
  def test_localhost_serves_on_127_0_0_1_and_ipv6_loopback_on_one_port
    skip "no IPv6 loopback here" unless Socket.ip_address_list.any?(&:ipv6_loopback?)
    server = start_server(["-l", "localhost:0"])
    port = server.tcp_port
    assert_equal ["http://127.0.0.1:#{port}", "http://[::1]:#{port}"], server.addrs
    %w[127.0.0.1 ::1].each do |ip|
      io = TCPSocket.new(ip, port)
      res = request(io, "GET", "/")
      assert_equal 200, res&.status, ip
    ensure
      io&.close
    end
  end
end
