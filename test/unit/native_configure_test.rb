# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# The settings of connections have one source, Config::DEFAULTS: C has no values of its own, so
# until Native.configure has run no connection is made (Conn.accept and Conn.receive raise), and a
# configure that raises (a missing key) leaves it so. In a fresh process: the tests of this
# process have configured it already.
class NativeConfigureTest < Minitest::Test
  SCRIPT = <<~'RUBY'
    require "blackbuck"
    require "socket"
    require "tmpdir"
    Native = Blackbuck::Native
    def attempt
      yield
    rescue StandardError => e
      puts "#{e.class}: #{e.message}"
    else
      puts "made"
    end
    Dir.mktmpdir do |dir|
      server = UNIXServer.new("#{dir}/s")
      clients = Array.new(2) { UNIXSocket.new("#{dir}/s") }
      sender, receiver = Socket.pair(:UNIX, :SEQPACKET)
      attempt { Native::Conn.accept(server.fileno, {}, false) }
      attempt { Native::Conn.receive(receiver.fileno, [[{}, false]]) }
      attempt { Native.configure(Blackbuck::Config.new.values.except(:write_timeout)) }
      attempt { Native::Conn.accept(server.fileno, {}, false) }
      attempt { Native.configure(Blackbuck::Config.new.values) }
      attempt { Native::Conn.accept(server.fileno, {}, false) or raise "nothing to accept" }
      clients.each(&:close)
      sender.close
    end
  RUBY

  def test_no_connection_before_the_settings
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{ROOT}/lib", "-e", SCRIPT)
    assert status.success?, err
    unset = "RuntimeError: Blackbuck::Native.configure must be called first (with Blackbuck::Config#values)"
    assert_equal [unset, unset, "KeyError: key not found: :write_timeout", unset, "made", "made"], out.lines.map(&:chomp)
  end
end
