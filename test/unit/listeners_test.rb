# frozen_string_literal: true

require_relative "../test_helper"
require "minitest/mock"
require "etc"
require "blackbuck"

# A host name with several addresses is bound at each of them, on one port (as Puma binds
# localhost at ::1 and 127.0.0.1); an address this machine cannot have is skipped.
class ListenersTest < Minitest::Test
  def resolving(*ips, &block)
    Addrinfo.stub(:getaddrinfo, ->(*) { ips.map { |ip| Addrinfo.tcp(ip, 0) } }, &block)
  end

  def ipv6_loopback? = Socket.ip_address_list.any?(&:ipv6_loopback?)

  def test_every_address_of_a_name_on_one_port
    skip "no IPv6 loopback here" unless ipv6_loopback?
    listeners = resolving("::1", "127.0.0.1") { Blackbuck::Listeners.bind_all("app.test:0", backlog: 16) }
    assert_equal %w[::1 127.0.0.1], listeners.map(&:host)
    assert_equal 1, listeners.map(&:port).uniq.size, "the kernel's pick for the first, the same for the rest"
    listeners.each { |l| TCPSocket.new(l.host, l.port).close } # each one accepts
  ensure
    listeners&.each(&:close)
  end

  # An /etc/hosts without "::1 localhost" (Debian's images, containers; this resolver stub) still
  # gets both loopback addresses, as Puma binds them: a browser or curl that tries ::1 first is not
  # refused. (Issue 22, item 9: before, localhost bound 127.0.0.1 alone on such a machine.)
  def test_localhost_is_127_0_0_1_and_ipv6_loopback_whatever_the_resolver_says
    skip "no IPv6 loopback here" unless ipv6_loopback?
    listeners = resolving("127.0.0.1") { Blackbuck::Listeners.bind_all("localhost:0", backlog: 16) }
    assert_equal %w[127.0.0.1 ::1], listeners.map(&:host)
    assert_equal 1, listeners.map(&:port).uniq.size
    listeners.each { |l| TCPSocket.new(l.host, l.port).close }
    resolving("127.0.0.1") do
      assert Blackbuck::Listeners.names?("localhost:#{listeners[1].port}", listeners[1].io.local_address),
             "localhost names the ::1 listener (inherited sockets, a HUP that keeps it)"
    end
  ensure
    listeners&.each(&:close)
  end

  # A machine without IPv6 (socket(AF_INET6) fails): localhost is 127.0.0.1 alone, not an error.
  def test_localhost_without_ipv6_is_127_0_0_1
    real = Socket.method(:new)
    no_v6 = ->(family, *rest) { family == Socket::AF_INET6 ? raise(Errno::EAFNOSUPPORT) : real.call(family, *rest) }
    listeners = Socket.stub(:new, no_v6) { Blackbuck::Listeners.bind_all("localhost:0", backlog: 16) }
    assert_equal %w[127.0.0.1], listeners.map(&:host)
  ensure
    listeners&.each(&:close)
  end

  # One listener (the status listener's): the first address, and no other left open on the port.
  def test_bind_is_the_first_address_only
    skip "no IPv6 loopback here" unless ipv6_loopback?
    listener = Blackbuck::Listeners.bind("localhost:0", backlog: 16)
    assert_equal "127.0.0.1", listener.host
    assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("::1", listener.port).close }
  ensure
    listener&.close
  end

  def test_an_address_the_machine_does_not_have_is_skipped_unless_it_is_the_only_one
    listeners = resolving("192.0.2.1", "127.0.0.1") { Blackbuck::Listeners.bind_all("app.test:0", backlog: 16) }
    assert_equal %w[127.0.0.1], listeners.map(&:host)
    err = assert_raises(Blackbuck::ConfigError) do
      resolving("192.0.2.1") { Blackbuck::Listeners.bind_all("app.test:0", backlog: 16) }
    end
    assert_match(/cannot listen on app\.test:0: .*(not available|Cannot assign)/i, err.message)
  ensure
    listeners&.each(&:close)
  end

  # A server that may not give its socket to unix_socket_group (not root, not a member: chown
  # answers EPERM) stops at boot with one line naming the setting, and leaves no socket file.
  def test_a_group_the_server_may_not_give_is_a_boot_error_and_leaves_no_file
    Dir.mktmpdir("bb-test") do |dir|
      path = "#{dir}/app.sock"
      gid = Etc.getgrnam("www-data").gid
      err = File.stub(:lchown, ->(*) { raise Errno::EPERM, "@ apply2files - #{path}" }) do # what Ruby raises
        assert_raises(Blackbuck::ConfigError) do
          Blackbuck::Listeners.bind_all("unix:#{path}", backlog: 16, unix_mode: 0o660, unix_group: gid)
        end
      end
      assert_equal "unix_socket_group: cannot give unix:#{path} to group www-data: Operation not permitted " \
                   "(the server must run as root or as a member of www-data)", err.message
      refute File.exist?(path), "the socket file bound before the chown is removed"
    end
  rescue ArgumentError # no www-data group here
    skip "no www-data group"
  end
end
