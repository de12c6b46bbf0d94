# frozen_string_literal: true

require_relative "../test_helper"
require "open3"
require "json"

# `rackup -s blackbuck` with Rhebok-style and snake_case options (Rack 3 + rackup gem here;
# Rack 2.2's own rackup under rake test:rack2).
class HandlerTest < ServerTest
  def setup
    @dir = Dir.mktmpdir("bb-test")
  end

  def teardown
    @rackup&.stop
    warn "\n--- rackup log (#{name}) ---\n#{@rackup.log}--- end ---" if @rackup && !passed?
    FileUtils.rm_rf(@dir)
    super
  end

  # `rackup -s blackbuck OPTIONS kitchen.ru`; waits for `workers` ready lines unless 0.
  def rackup(*options, workers: 1)
    rack2 = Gem.loaded_specs["rack"]&.version.to_s.start_with?("2.")
    bin = Gem.bin_path(rack2 ? "rack" : "rackup", "rackup")
    @rackup = ChildProcess.new([RbConfig.ruby, "-I", File.join(ROOT, "lib"), bin, "-s", "blackbuck", "-E", "none",
                                *options, File.join(APPS, "kitchen.ru")], log_path: "#{@dir}/rackup.log")
    wait_for(20) { @rackup.log.scan(/worker \d \(pid \d+\) ready/).size >= workers || @rackup.exited? } if workers.positive?
    @rackup
  end

  def test_rackup_with_rhebok_option_names
    sock = "#{@dir}/rackup.sock"
    server = rackup("-O", "Path=#{sock}", "-O", "MaxWorkers=2", "-O", "MaxRequestPerChild=100", "-O", "Timeout=30",
                    workers: 2)
    io = UNIXSocket.new(sock)
    assert_equal "hello world\n", request(io, "GET", "/hello").body
    io.close
    server.signal(:TERM)
    assert server.wait_exit(15)&.success?, server.log
  end

  def test_rackup_with_host_and_port
    port = free_port
    rackup("-o", "127.0.0.1", "-p", port.to_s, "-O", "workers=1")
    io = TCPSocket.new("127.0.0.1", port)
    assert_equal 200, request(io, "GET", "/hello").status
  ensure
    io&.close
  end

  # Options the caller passes that are not settings (Rails and rackup pass their own; a user may
  # mistype one): a warning for the unknown ones, and the server starts.
  def test_unknown_option_is_a_warning_not_a_crash
    sock = "#{@dir}/rackup.sock"
    server = rackup("-O", "Path=#{sock}", "-O", "workers=1", "-O", "frobnicate=3")
    assert_match(/WARN ignoring unknown option frobnicate="3"/, server.log)
    io = UNIXSocket.new(sock)
    assert_equal 200, request(io, "GET", "/hello").status
  ensure
    io&.close
  end

  # rack.early_hints only when asked for: Rails (>= 7.1) sends a 103 from its asset tags whenever the
  # env offers it, and nginx before 1.29 cannot pass one on (the page hangs). `rails server
  # --early-hints` passes early_hints: true; rackup's -O passes the setting by name.
  def test_early_hints_are_offered_only_when_asked_for
    [[[], "false"], [%w[-O early_hints=true], "true"]].each do |options, offered|
      sock = "#{@dir}/rackup.sock"
      server = rackup("-O", "Path=#{sock}", "-O", "workers=1", *options)
      io = UNIXSocket.new(sock)
      assert_equal offered, JSON.parse(request(io, "GET", "/env").body)["rack.early_hints?"], options.inspect
      io.close
      server.signal(:TERM)
      assert server.wait_exit(15)&.success?, server.log
    end
  end

  def test_bad_value_is_one_line_and_exit_1
    server = rackup("-O", "workers=zero", workers: 0)
    status = server.wait_exit(20)
    assert_equal 1, status&.exitstatus, server.log
    assert_match(/\Ablackbuck: workers must be an integer 1\.\.4096, got "zero"$/, server.log)
    refute_match(/\.rb:\d+:in/, server.log, "no backtrace")
  end
end
