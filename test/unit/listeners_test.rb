# frozen_string_literal: true

require_relative "../test_helper"
require "minitest/mock"
require "blackbuck"

# A host name with several addresses is bound at each of them, on one port (as Puma binds
# localhost at ::1 and 127.0.0.1); an address this machine cannot have is skipped.
class ListenersTest < Minitest::Test
  def resolving(*ips, &block)
    Addrinfo.stub(:getaddrinfo, ->(*) { ips.map { |ip| Addrinfo.tcp(ip, 0) } }, &block)
  end

  def test_every_address_of_a_name_on_one_port
    listeners = resolving("::1", "127.0.0.1") { Blackbuck::Listeners.bind_all("localhost:0", backlog: 16) }
    assert_equal %w[::1 127.0.0.1], listeners.map(&:host)
    assert_equal 1, listeners.map(&:port).uniq.size, "the kernel's pick for the first, the same for the rest"
    listeners.each { |l| TCPSocket.new(l.host, l.port).close } # each one accepts
  ensure
    listeners&.each(&:close)
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
end
