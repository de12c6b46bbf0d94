# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# The warmup directive and gc_before_fork, through the real `blackbuck`: the master requests the
# paths before it forks and the workers inherit what that built; a failing path ends the boot with
# one line; the boot cost is logged; a socket the warm-up leaves open is named.
class WarmupTest < ServerTest
  # A server for test/apps/warmup.ru with config (a config file's text).
  def start_warm(config, wait: true, env: {})
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", config)
    start_server(["-c", "#{dir}/blackbuck.rb", "-l", "127.0.0.1:0"], app: "warmup.ru", dir: dir, wait: wait, env: env)
  end

  def get_state(server)
    io = server.tcp
    res = request(io, "GET", "/state")
    assert_equal 200, res.status
    res.body
  ensure
    io&.close
  end

  # A boot that must fail: its exit status and what it printed.
  def failed_boot(config)
    s = start_warm(config, wait: false)
    status = s.wait_exit(60)
    refute_nil status, "the server was still running:\n#{s.log}"
    [status, s.log]
  end

  def test_the_worker_inherits_what_the_warm_up_built_in_the_master
    s = start_warm(%(warmup "/", "/posts", "/missing"\n))
    body = get_state(s)
    master = body[/master=(\d+)/, 1]
    assert_equal s.pid.to_s, master
    assert_match(%r{warmed=/,/posts,/missing }, body, "the master requested the paths, in order, before the fork")
    assert_match(/built_by=#{master} /, body, "the value was built in the master, and the worker has it")
    refute_equal master, body[/pid=(\d+)/, 1]
    assert_match(%r{WARN warm-up: GET /missing answered 404; booting anyway}, s.log)
    assert_match(%r{INFO warm-up: 3 paths \(/ 200, /posts 200, /missing 404\) in \d+\.\d\d s$}, s.log)
  end

  def test_the_block_runs_in_the_master_with_the_app
    s = start_warm(%(warmup { |app| app.call("PATH_INFO" => "/from-block") }\n))
    assert_match(%r{warmed=/from-block built_by=#{s.pid} }, get_state(s))
    assert_match(/INFO warm-up: the warmup block in/, s.log)
  end

  def test_a_path_answering_500_ends_the_boot_with_one_line
    status, log = failed_boot(%(warmup "/", "/fail"\n))
    assert_equal 1, status.exitstatus, log
    assert_match(%r{^blackbuck: warm-up: GET /fail answered 500$}, log)
    refute_match(/listening on|worker \d+ .*ready/, log, "no listener bound, no worker forked")
  end

  # HUP's boot check (`blackbuck --check`) runs the warm-up too, so new code whose warm-up fails is
  # never exec'd in place of the running master.
  def test_the_boot_check_runs_the_warm_up
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", %(warmup "/raise"\n))
    out, status = Open3.capture2e(RbConfig.ruby, EXE, "--check", "-c", "#{dir}/blackbuck.rb", File.join(APPS, "warmup.ru"))
    assert_equal 1, status.exitstatus, out
    assert_match(%r{^blackbuck: warm-up: GET /raise raised RuntimeError: cold database}, out)
    File.write("#{dir}/blackbuck.rb", %(warmup "/"\n))
    out, status = Open3.capture2e(RbConfig.ruby, EXE, "--check", "-c", "#{dir}/blackbuck.rb", File.join(APPS, "warmup.ru"))
    assert status.success?, out
    assert_match(/boots/, out)
  ensure
    FileUtils.rm_rf(dir) if dir
  end

  # refork_after: the blackbuck command's master holds no app; the mold that boots it warms it
  # up, and its workers inherit what that built.
  def test_with_reforking_the_mold_that_boots_the_app_warms_it_up
    s = start_warm(%(warmup "/", "/posts"\nrefork_after 1000\n))
    body = get_state(s)
    loader = body[/master=(\d+)/, 1]
    refute_equal s.pid.to_s, loader, "the master did not load the app"
    assert_match(/refork: mold of generation 0 is pid #{loader} \(it booted the app\)/, s.log)
    assert_match(%r{warmed=/,/posts built_by=#{loader} }, body)
    assert_match(/\[#{loader}\] INFO warm-up: 2 paths/, s.log)
  end

  def test_with_reforking_a_warm_up_that_fails_ends_the_boot
    status, log = failed_boot(%(warmup "/raise"\nrefork_after 1000\n))
    assert_equal 1, status.exitstatus, log
    assert_match(%r{ERROR cannot boot the app: warm-up: GET /raise raised RuntimeError: cold database \(\S*warmup\.ru:\d+\); stopping$}, log)
    refute_match(/worker \d+ .*ready/, log, "no worker forked")
  end

  def test_a_path_that_raises_ends_the_boot_naming_path_and_error
    status, log = failed_boot(%(warmup "/raise"\n))
    assert_equal 1, status.exitstatus, log
    assert_match(%r{^blackbuck: warm-up: GET /raise raised RuntimeError: cold database \(\S*warmup\.ru:\d+\)$}, log)
    assert_equal 1, log.lines.grep(/raise/).size, "one line, no backtrace:\n#{log}"
  end

  def test_the_heap_is_prepared_before_the_first_fork_and_the_cost_logged
    s = start_warm(%(warmup "/"\n))
    log = s.log
    heap = log.index(/INFO heap prepared for fork in \d+\.\d\d s: .*heap pages [\d,]+ -> [\d,]+, free slots/)
    refute_nil heap, log
    assert_operator heap, :<, log.index(/worker 0 \(pid \d+\) ready/), "before the first fork"
    free_before, free_after = log[/free slots ([\d,]+) -> ([\d,]+)/].scan(/[\d,]+/).map { |n| n.delete(",").to_i }
    assert_operator free_after, :>, free_before, "the master's garbage is swept before the fork"

    off = start_warm(%(gc_before_fork false\n))
    refute_match(/heap prepared/, off.log, "gc_before_fork false: no GC step")
  end

  def test_a_socket_the_warm_up_left_open_is_named
    db = TCPServer.new("127.0.0.1", 0)
    port = db.addr[1]
    s = start_warm(%(warmup { |_app| $db = TCPSocket.new("127.0.0.1", #{port}) }\n))
    assert_match(/WARN warm-up left socket fd \d+ open \(TCP 127\.0\.0\.1:#{port}\): workers inherit it; close it in the warmup block or reconnect in after_fork/, s.log)
    closed = start_warm(%(warmup { |_app| TCPSocket.new("127.0.0.1", #{port}).close }\n))
    refute_match(/left socket/, closed.log)
  ensure
    db&.close
  end
end
