# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# `rackup -s blackbuck` with Rhebok-style and snake_case options (Rack 3 + rackup gem here;
# Rack 2.2's own rackup under rake test:rack2).
class HandlerTest < ServerTest
  def rackup_cmd
    rack2 = Gem.loaded_specs["rack"]&.version.to_s.start_with?("2.")
    gem = rack2 ? "rack" : "rackup"
    [RbConfig.ruby, "-I", File.join(ROOT, "lib"), Gem.bin_path(gem, "rackup")]
  end

  def test_rackup_with_rhebok_option_names
    dir = Dir.mktmpdir("bb-test")
    sock = "#{dir}/rackup.sock"
    log = "#{dir}/rackup.log"
    pid = Process.spawn(*rackup_cmd, "-s", "blackbuck", "-E", "none", "-O", "Path=#{sock}", "-O", "MaxWorkers=2",
                        "-O", "MaxRequestPerChild=100", "-O", "Timeout=30", File.join(APPS, "kitchen.ru"),
                        out: log, err: %i[child out], pgroup: true)
    Timeout.timeout(20) { sleep 0.05 until File.read(log).scan(/worker \d \(pid \d+\) ready/).size == 2 }
    io = UNIXSocket.new(sock)
    assert_equal "hello world\n", request(io, "GET", "/hello").body
    io.close
    Process.kill(:TERM, pid)
    _, status = Process.wait2(pid)
    assert status.success?, File.read(log)
  ensure
    begin
      Process.kill(:KILL, -pid) if pid
    rescue Errno::ESRCH
      nil
    end
    warn File.read(log) if log && !passed? && File.exist?(log)
  end

  def test_rackup_with_host_and_port
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    dir = Dir.mktmpdir("bb-test")
    log = "#{dir}/rackup.log"
    pid = Process.spawn(*rackup_cmd, "-s", "blackbuck", "-E", "none", "-o", "127.0.0.1", "-p", port.to_s,
                        "-O", "workers=1", File.join(APPS, "kitchen.ru"), out: log, err: %i[child out], pgroup: true)
    Timeout.timeout(20) { sleep 0.05 until File.read(log).include?("worker 0 (pid") }
    io = TCPSocket.new("127.0.0.1", port)
    assert_equal 200, request(io, "GET", "/hello").status
    io.close
  ensure
    if pid
      Process.kill(:TERM, pid)
      Process.wait(pid)
    end
    warn File.read(log) if log && !passed? && File.exist?(log)
  end

  # Options the caller passes that are not settings (Rails and rackup pass their own; a user may
  # mistype one): a warning for the unknown ones, and the server starts.
  def test_unknown_option_is_a_warning_not_a_crash
    dir = Dir.mktmpdir("bb-test")
    sock = "#{dir}/rackup.sock"
    log = "#{dir}/rackup.log"
    pid = Process.spawn(*rackup_cmd, "-s", "blackbuck", "-E", "none", "-O", "Path=#{sock}", "-O", "workers=1",
                        "-O", "frobnicate=3", File.join(APPS, "kitchen.ru"), out: log, err: %i[child out], pgroup: true)
    Timeout.timeout(20) { sleep 0.05 until File.read(log).include?("worker 0 (pid") }
    assert_match(/WARN ignoring unknown option frobnicate="3"/, File.read(log))
    io = UNIXSocket.new(sock)
    assert_equal 200, request(io, "GET", "/hello").status
    io.close
  ensure
    if pid
      Process.kill(:TERM, pid)
      Process.wait(pid)
    end
    warn File.read(log) if log && !passed? && File.exist?(log)
  end

  def test_bad_value_is_one_line_and_exit_1
    dir = Dir.mktmpdir("bb-test")
    log = "#{dir}/rackup.log"
    pid = Process.spawn(*rackup_cmd, "-s", "blackbuck", "-E", "none", "-O", "workers=zero", File.join(APPS, "kitchen.ru"),
                        out: log, err: %i[child out], pgroup: true)
    _, status = Timeout.timeout(20) { Process.wait2(pid) }
    pid = nil
    assert_equal 1, status.exitstatus
    out = File.read(log)
    assert_match(/\Ablackbuck: workers must be an integer 1\.\.4096, got "zero"$/, out)
    refute_match(/\.rb:\d+:in/, out, "no backtrace")
  ensure
    Process.kill(:KILL, -pid) if pid
    warn File.read(log) if log && !passed? && File.exist?(log)
  end
end
