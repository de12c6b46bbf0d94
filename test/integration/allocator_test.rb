# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../../lib/blackbuck/allocator"

# The real `blackbuck` and its malloc: `--jemalloc` (or `jemalloc true`) restarts the command with
# Debian's libjemalloc2 preloaded, so the workers run on it; without it the boot log says it is
# installed and unused; with threads the master caps glibc's arenas and says so.
class AllocatorIntegrationTest < ServerTest
  def jemalloc
    @jemalloc ||= Blackbuck::Allocator.new.jemalloc_installed ||
                  skip("libjemalloc2 is not installed (bin/setup installs it as root)")
  end

  def worker_maps(server) = File.read("/proc/#{server.worker_pids.first}/maps")

  def test_jemalloc_flag_makes_the_workers_run_on_jemalloc
    server = start_server(["-l", "127.0.0.1:0", "--jemalloc"])
    assert_includes worker_maps(server), "libjemalloc.so"
    assert_includes server.log, "INFO malloc: jemalloc (#{jemalloc})"
    # The re-exec keeps the pid: the process the test started is the master.
    assert_includes server.log, "pid #{server.pid}"
    io = server.tcp
    assert_equal 200, request(io, "GET", "/hello").status
  ensure
    io&.close
  end

  def test_jemalloc_in_the_config_file
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", "jemalloc true\n")
    server = start_server(["-l", "127.0.0.1:0", "-c", "#{dir}/blackbuck.rb"], dir: dir)
    assert_includes worker_maps(server), jemalloc
  end

  def test_without_it_the_log_says_jemalloc_is_installed_and_unused
    server = start_server(["-l", "127.0.0.1:0"])
    assert_includes server.log, "INFO malloc: glibc; jemalloc is installed at #{jemalloc} and unused (set jemalloc true)"
    refute_includes worker_maps(server), "libjemalloc"
    refute_match(/arenas/, server.log, "one thread: glibc's arenas are left alone") unless ServerProcess::THREADS
  end

  # The marker says the re-exec happened; jemalloc is still not mapped (no LD_PRELOAD here): one
  # error line and exit 1, never a second exec.
  def test_a_reexec_that_did_not_load_jemalloc_is_an_error_not_a_loop
    jemalloc
    dir = Dir.mktmpdir("bb-test")
    child = ChildProcess.new([RbConfig.ruby, EXE, "-l", "127.0.0.1:0", "--jemalloc", File.join(APPS, "hello.ru")],
                             log_path: "#{dir}/server.log", env: { Blackbuck::Allocator::REEXEC_ENV => "1" })
    status = child.wait_exit(30)
    assert_equal 1, status&.exitstatus, child.log
    assert_match(/\Ablackbuck: jemalloc is set, but restarting with LD_PRELOAD=.* did not load #{Regexp.escape(jemalloc)}\n\z/,
                 child.log)
  ensure
    child&.stop
    FileUtils.rm_rf(dir) if dir
  end

  # rackup has loaded the app before the handler runs: no re-exec, a warning that says what to do.
  def test_rackup_asked_for_jemalloc_says_to_set_ld_preload
    jemalloc
    dir = Dir.mktmpdir("bb-test")
    rack2 = Gem.loaded_specs["rack"]&.version.to_s.start_with?("2.")
    bin = Gem.bin_path(rack2 ? "rack" : "rackup", "rackup")
    child = ChildProcess.new([RbConfig.ruby, "-I", File.join(ROOT, "lib"), bin, "-s", "blackbuck", "-E", "none",
                              "-o", "127.0.0.1", "-p", "0", "-O", "workers=1", "-O", "jemalloc=true",
                              File.join(APPS, "hello.ru")], log_path: "#{dir}/rackup.log")
    wait_for(30) { child.worker_pids.any? || child.exited? }
    assert_match(/WARN malloc: glibc, though jemalloc is set: .* start it with LD_PRELOAD=#{Regexp.escape(jemalloc)}/,
                 child.log)
  ensure
    child&.stop
    FileUtils.rm_rf(dir) if dir
  end

  def test_threads_cap_the_arenas
    server = start_server(["-l", "127.0.0.1:0", "--threads", "2"])
    assert_includes server.log, "INFO malloc: at most 2 glibc arenas (the default with 2 app threads;"
  end

  # glibc read MALLOC_ARENA_MAX itself: the master leaves it.
  def test_malloc_arena_max_in_the_environment_stands
    server = start_server(["-l", "127.0.0.1:0", "--threads", "2"], env: { "MALLOC_ARENA_MAX" => "4" })
    refute_match(/arenas/, server.log)
  end
end
