# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../../lib/blackbuck/yjit"
require "open3"

# The real `blackbuck` and YJIT: `--yjit` / `--yjit-mem-size` start it before the app loads, with
# the limit given the way the running Ruby takes it: RubyVM::YJIT.enable(mem_size:) in place on
# 4.0, an exec of the same command with --yjit-mem-size (3.4) or --yjit-exec-mem-size (3.1-3.3)
# elsewhere, keeping the pid. The workers run YJIT; the boot log says the limit and where it came from.
class YjitIntegrationTest < ServerTest
  YJIT = Blackbuck::YJIT

  def setup
    super
    skip "this Ruby has no YJIT" unless YJIT.available?
  end

  def probe(server)
    io = server.tcp
    res = request(io, "GET", "/")
    assert_equal 200, res.status
    res.body
  ensure
    io&.close
  end

  def test_yjit_mem_size_starts_yjit_with_that_limit_in_every_worker
    server = start_server(["-l", "127.0.0.1:0", "--yjit-mem-size", "24"], app: "yjit_probe.ru")
    body = probe(server)
    assert_includes body, "enabled=true", server.log
    assert_includes server.log, "pid #{server.pid}", "a re-exec keeps the pid: the process started is the master"
    if YJIT.enable_takes_mem_size?
      assert_includes server.log, "YJIT: on, memory limit 24 MiB (yjit_mem_size: RubyVM::YJIT.enable(mem_size: 24))"
      refute_includes server.log, "#{YJIT::MEM_FLAGS.first}=", "started in place: no exec"
    else
      # 3.2 and later reserve the region and say the limit; 3.1 maps all of it, and it is measured
      assert_match(/YJIT: on, (memory limit 24 MiB \(#{YJIT.mem_flag}\)|code region 24 MiB)/, server.log)
    end
  end

  def test_yjit_in_the_config_file_starts_it_before_the_app
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", "yjit true\n")
    server = start_server(["-l", "127.0.0.1:0", "-c", "#{dir}/blackbuck.rb"], app: "yjit_probe.ru", dir: dir)
    assert_includes probe(server), "enabled=true"
    assert_match(/INFO YJIT: on, /, server.log)
  end

  def test_without_the_settings_yjit_is_left_to_ruby_and_the_app
    server = start_server(["-l", "127.0.0.1:0"], app: "yjit_probe.ru", env: { "RUBY_YJIT_ENABLE" => nil })
    assert_includes probe(server), "enabled=false"
    assert_includes server.log, "INFO YJIT: off"
  end

  # The marker says the re-exec happened, yet YJIT is off: one error line and exit 1, never a loop.
  def test_a_reexec_that_did_not_start_yjit_is_an_error_not_a_loop
    skip "Ruby 4.0 starts YJIT in place: no re-exec" if YJIT.enable_takes_mem_size?
    dir = Dir.mktmpdir("bb-test")
    child = ChildProcess.new([RbConfig.ruby, EXE, "-l", "127.0.0.1:0", "--yjit-mem-size", "24", File.join(APPS, "hello.ru")],
                             log_path: "#{dir}/server.log", env: { YJIT::REEXEC_ENV => "1" })
    status = child.wait_exit(30)
    assert_equal 1, status&.exitstatus, child.log
    assert_equal "blackbuck: yjit is set, but YJIT did not start after a restart with --yjit\n", child.log
  ensure
    child&.stop
    FileUtils.rm_rf(dir) if dir
  end

  def test_a_bad_limit_names_the_setting
    _out, err, status = Open3.capture3(RbConfig.ruby, EXE, "--check", "--yjit-mem-size", "0", File.join(APPS, "hello.ru"))
    assert_equal [1, "blackbuck: yjit_mem_size must be an integer 1..4096, got \"0\"\n"], [status.exitstatus, err]
  end
end
