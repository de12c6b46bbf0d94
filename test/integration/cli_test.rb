# frozen_string_literal: true

require_relative "../test_helper"
require "open3"
require_relative "../../lib/blackbuck/memory"

# The command line: mistakes are one line on stderr and a non-zero exit, never a backtrace.
class CLITest < ServerTest
  def run_cli(*args, chdir: ROOT, env: {})
    out, err, status = Open3.capture3(env, RbConfig.ruby, EXE, *args, chdir: chdir)
    [out, err, status]
  end

  def assert_one_line_error(err, pattern)
    assert_match pattern, err
    assert_equal 1, err.lines.size, "one line, no backtrace: #{err}"
    refute_match(/\.rb:\d+:in/, err)
  end

  def test_version_and_help
    out, _err, status = run_cli("-v")
    assert status.success?
    assert_match(/\Ablackbuck \d+\.\d+\.\d+\n\z/, out)
    out, _err, status = run_cli("-h")
    assert status.success?
    %w[--listen --workers --backlog --config --max-requests-per-child --timeout --keepalive-timeout --max-body
       --unix-socket-mode --unix-socket-group].each do |o|
      assert_includes out, o
    end
    assert_match(/^Commands:\n +blackbuck status \[--json\] \[-c FILE\] \[ADDR\]\n.*\$BLACKBUCK_STATS/m, out)
  end

  def test_unknown_option
    _out, err, status = run_cli("--frobnicate")
    assert_equal 2, status.exitstatus
    assert_one_line_error(err, /invalid option: --frobnicate/)
  end

  def test_bad_values
    {
      %w[-w zero] => /workers must be an integer 1\.\.4096, got "zero"/,
      %w[-w 0] => /workers must be an integer 1\.\.4096/,
      %w[--timeout -3] => /timeout must be a positive number of seconds/,
      %w[--handoff-after soon] => /handoff_after must be a non-negative number of seconds, got "soon"/,
      %w[-l nonsense:port:x] => /invalid listen address "nonsense:port:x"/,
      %w[-l 127.0.0.1:99999] => /invalid port in listen address/,
      %w[--unix-socket-group no-such-group-bb] => /\Ablackbuck: unix_socket_group: no group named "no-such-group-bb"$/,
      %w[--unix-socket-group 99999999999] => /unix_socket_group must be an integer 0\.\.4294967294/
    }.each do |args, pattern|
      _out, err, status = run_cli(*args, File.join(APPS, "hello.ru"))
      assert_equal 1, status.exitstatus, args.inspect
      assert_one_line_error(err, pattern)
    end
  end

  # --[no-]oob-major-gc (issue 34): where this Ruby's GC can leave major GCs to the worker (Ruby >= 3.4)
  # the flag is taken; elsewhere it stops the boot with one line that names the Ruby, exit 1. The
  # --no- form is taken on any Ruby.
  def test_oob_major_gc_flag
    app = File.join(APPS, "hello.ru")
    out, err, status = run_cli("--oob-major-gc", "--check", app)
    if Blackbuck::Memory.major_gc_control?
      assert status.success?, err
      assert_match(/hello\.ru boots/, out)
    else
      assert_equal 1, status.exitstatus
      assert_one_line_error(err, /\Ablackbuck: oob_major_gc needs GC\.config\(rgengc_allow_full_mark:\) \(Ruby >= 3\.4 with its default GC\); Ruby #{Regexp.escape(RUBY_VERSION)} has none/)
    end
    _out, err, status = run_cli("--no-oob-major-gc", "--check", app)
    assert status.success?, err
    _out, err, status = run_cli("--oob-major-gc=maybe", "--check", app)
    assert_equal 2, status.exitstatus, "an argument the switch does not take: OptionParser's error"
    assert_one_line_error(err, /needless argument: --oob-major-gc=maybe/)
  end

  def test_missing_rackup_file
    Dir.mktmpdir do |d|
      _out, err, status = run_cli(chdir: d)
      assert_equal 1, status.exitstatus
      assert_one_line_error(err, /rackup file config\.ru not found/)
    end
  end

  def test_broken_rackup_files
    Dir.mktmpdir do |d|
      File.write("#{d}/syntax.ru", "run lambda { |env| [200, {}, [\"x\"] }\n")
      File.write("#{d}/raises.ru", "require 'no_such_gem_here'\nrun ->(e) {}\n")
      File.write("#{d}/noapp.ru", "x = 1\n")
      _o, err, status = run_cli("-l", "127.0.0.1:0", "#{d}/syntax.ru")
      assert_equal 1, status.exitstatus
      assert_one_line_error(err, /cannot load .*syntax\.ru:1: syntax error, \S/)
      _o, err, status = run_cli("-l", "127.0.0.1:0", "#{d}/raises.ru")
      assert_equal 1, status.exitstatus
      assert_one_line_error(err, /cannot load .*raises\.ru: LoadError: cannot load such file -- no_such_gem_here/)
      _o, err, status = run_cli("-l", "127.0.0.1:0", "#{d}/noapp.ru")
      assert_equal 1, status.exitstatus
      assert_one_line_error(err, /noapp\.ru/)
    end
  end

  def test_port_in_use
    blocker = TCPServer.new("127.0.0.1", 0)
    _o, err, status = run_cli("-l", "127.0.0.1:#{blocker.addr[1]}", File.join(APPS, "hello.ru"))
    assert_equal 1, status.exitstatus
    assert_one_line_error(err, /cannot listen on 127\.0\.0\.1:\d+: Address already in use/)
  ensure
    blocker&.close
  end

  def test_config_file_errors_name_the_directive
    Dir.mktmpdir do |d|
      File.write("#{d}/bad.rb", "workers 2\nfrobnicate 3\n")
      _o, err, status = run_cli("-c", "#{d}/bad.rb", File.join(APPS, "hello.ru"))
      assert_equal 1, status.exitstatus
      assert_one_line_error(err, /bad\.rb:2: unknown directive frobnicate/)
      File.write("#{d}/bad2.rb", "max_body 'lots'\n")
      _o, err, = run_cli("-c", "#{d}/bad2.rb", File.join(APPS, "hello.ru"))
      assert_one_line_error(err, /bad2\.rb:1: max_body must be an integer/)
      _o, err, = run_cli("-c", "#{d}/missing.rb", File.join(APPS, "hello.ru"))
      assert_one_line_error(err, /cannot read config file .*missing\.rb/)
    end
  end

  def test_config_file_and_hooks_and_cli_precedence
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/conf.rb", <<~RUBY)
      listen "unix:#{dir}/from-config.sock"
      workers 3
      after_fork { |_server, index| File.write("#{dir}/forked-\#{index}", Process.pid.to_s) }
    RUBY
    server = start_server(["-c", "#{dir}/conf.rb", "-l", "127.0.0.1:0"], workers: 2, dir: dir, app: "kitchen.ru")
    assert_includes server.addrs, "unix:#{dir}/from-config.sock"
    assert_equal 2, server.worker_pids.size, "-w on the command line (set by the helper) wins over the file"
    assert File.exist?("#{dir}/forked-0") && File.exist?("#{dir}/forked-1")
    io = server.unix
    assert_equal 200, request(io, "GET", "/hello").status
  ensure
    io&.close
  end

  def test_port_env_and_pid_file
    dir = Dir.mktmpdir("bb-test")
    port = free_port
    server = start_server(["-o", "127.0.0.1", "--pid", "#{dir}/bb.pid"], env: { "PORT" => port.to_s }, dir: dir)
    assert_equal ["http://127.0.0.1:#{port}"], server.addrs
    assert_equal server.pid, File.read("#{dir}/bb.pid").to_i
    server.stop
    refute File.exist?("#{dir}/bb.pid"), "the pid file is removed on exit"
  end

  def test_stale_unix_socket_is_replaced_and_live_one_refused
    dir = Dir.mktmpdir("bb-test")
    path = "#{dir}/app.sock"
    UNIXServer.new(path).close # a socket file nobody listens on: stale
    assert File.socket?(path)
    server = start_server(["-l", "unix:#{path}", "--unix-socket-mode", "0600"], dir: dir)
    assert_equal 0o600, File.stat(path).mode & 0o777
    _o, err, status = run_cli("-l", "unix:#{path}", File.join(APPS, "hello.ru"))
    assert_equal 1, status.exitstatus
    assert_one_line_error(err, /another server is listening there/)
    server.stop
    refute File.exist?(path), "the socket file is removed on exit"
  end
end
