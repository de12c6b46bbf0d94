# frozen_string_literal: true

require "minitest/autorun"
require "tmpdir"
require "fileutils"
require "blackbuck"
require "blackbuck/allocator"

# Allocator: which malloc runs (read from a fake /proc/self/maps here), the environment and command
# line of the jemalloc re-exec, the arena cap's default, and the boot lines.
class AllocatorTest < Minitest::Test
  Allocator = Blackbuck::Allocator
  LIB = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
  MAPS = <<~MAPS
    55d0c8a00000-55d0c8a01000 r--p 00000000 fe:00 1234  /usr/bin/ruby3.1
    7f0e51e6b000-7f0e61e6b000 r-xp 00000000 00:00 0
    7f0e62000000-7f0e62100000 r-xp 00020000 fe:00 5678  /usr/lib/x86_64-linux-gnu/libc.so.6
    7ffd80823000-7ffd80844000 rw-p 00000000 00:00 0     [stack]
  MAPS
  JEMALLOC_LINE = "7fccfc600000-7fccfc609000 r--p 00000000 fe:00 15015960   #{LIB}\n"

  # Records what boot logs.
  class Log
    attr_reader :lines

    def initialize = @lines = []
    def info(text) = @lines << [:info, text]
    def warn(text) = @lines << [:warn, text]
  end

  def setup
    @dir = Dir.mktmpdir("bb-alloc")
    @lib = "#{@dir}/libjemalloc.so.2"
    File.write(@lib, "")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def maps(text)
    File.write("#{@dir}/maps", text)
    "#{@dir}/maps"
  end

  def allocator(env: {}, maps: maps(MAPS), paths: [@lib], ldconfig: -> { nil })
    Allocator.new(env: env, maps: maps, paths: paths, ldconfig: ldconfig)
  end

  def config(**values) = { jemalloc: false, malloc_arena_max: nil, threads: 1 }.merge(values)

  def test_jemalloc_is_loaded_when_the_maps_list_it
    assert_nil allocator.jemalloc_loaded
    assert_equal LIB, allocator(maps: maps(MAPS + JEMALLOC_LINE)).jemalloc_loaded
  end

  # An LD_PRELOAD naming a file ld.so could not load does not count while the maps can be read.
  def test_ld_preload_is_believed_only_without_the_maps
    env = { "LD_PRELOAD" => "/opt/x.so #{LIB}" }
    assert_nil allocator(env: env).jemalloc_loaded
    assert_equal LIB, allocator(env: env, maps: "#{@dir}/no-such-maps").jemalloc_loaded
  end

  def test_installed_is_the_first_path_that_exists_else_ldconfigs
    assert_equal @lib, allocator(paths: ["#{@dir}/missing.so", @lib]).jemalloc_installed
    assert_equal "/opt/lib/libjemalloc.so.2", allocator(paths: [], ldconfig: -> { "/opt/lib/libjemalloc.so.2" }).jemalloc_installed
    assert_nil allocator(paths: []).jemalloc_installed
  end

  def test_ldconfig_output_names_the_library
    text = <<~LDCONFIG
      1234 libs found in cache `/etc/ld.so.cache'
      \tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2
      \tlibjemalloc.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so
    LDCONFIG
    assert_equal "/lib/x86_64-linux-gnu/libjemalloc.so.2", Allocator.ldconfig(text)
    assert_nil Allocator.ldconfig("\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n")
  end

  # jemalloc goes first, so its malloc is the one bound; what the user preloads stays.
  def test_reexec_env_prepends_to_ld_preload_and_sets_the_marker
    assert_equal({ "LD_PRELOAD" => @lib, Allocator::REEXEC_ENV => "1" }, allocator.reexec_env(@lib))
    env = allocator(env: { "LD_PRELOAD" => "/opt/trace.so" }).reexec_env(@lib)
    assert_equal "#{@lib}:/opt/trace.so", env["LD_PRELOAD"]
    assert_equal @lib, allocator(env: { "LD_PRELOAD" => "" }).reexec_env(@lib)["LD_PRELOAD"]
  end

  def test_reexec_only_when_not_loaded
    assert_nil allocator(maps: maps(MAPS + JEMALLOC_LINE)).reexec_for_jemalloc
    assert_equal @lib, allocator.reexec_for_jemalloc["LD_PRELOAD"]
  end

  def test_reexec_without_the_library_is_a_config_error
    e = assert_raises(Blackbuck::ConfigError) { allocator(paths: []).reexec_for_jemalloc }
    assert_match(/jemalloc is set, but no libjemalloc.so.2 is installed \(Debian: apt-get install libjemalloc2\)/, e.message)
  end

  # The re-exec happened (the marker) and jemalloc is still not mapped: an error, never a second exec.
  # The marker is taken out of the environment either way, so the app's subprocesses do not see it.
  def test_the_marker_stops_a_loop
    env = { Allocator::REEXEC_ENV => "1", "LD_PRELOAD" => @lib }
    e = assert_raises(Blackbuck::ConfigError) { allocator(env: env).reexec_for_jemalloc }
    assert_match(/restarting with LD_PRELOAD=#{Regexp.escape(@lib)} did not load/, e.message)
    refute env.key?(Allocator::REEXEC_ENV)
    env = { Allocator::REEXEC_ENV => "1" }
    assert_nil allocator(env: env, maps: maps(MAPS + JEMALLOC_LINE)).reexec_for_jemalloc
    refute env.key?(Allocator::REEXEC_ENV)
  end

  # The Ruby options before the script are kept (--yjit-exec-mem-size, -r): the same process again.
  def test_command_keeps_the_ruby_options_of_the_command_line
    argv = ["-w", "2", "config.ru"]
    cmdline = ["ruby", "--yjit", "--yjit-exec-mem-size=64", "-rfoo", "exe/blackbuck", *argv]
    assert_equal [RbConfig.ruby, "--yjit", "--yjit-exec-mem-size=64", "-rfoo", File.expand_path("exe/blackbuck"), *argv],
                 Allocator.command(argv, script: "exe/blackbuck", cmdline: cmdline, yjit: true, code_mib: 64)
    assert_equal [RbConfig.ruby, File.expand_path("exe/blackbuck")],
                 Allocator.command([], script: "exe/blackbuck", cmdline: ["ruby", "exe/blackbuck"], yjit: false, code_mib: nil)
  end

  # `bundle exec blackbuck` retitles the process: its command line is not [ruby, options, script, argv].
  def test_command_after_bundle_exec_passes_yjit_on_as_it_runs
    argv = ["-w", "2"]
    cmdline = ["/usr/local/bin/blackbuck -w 2"]
    script = "/usr/local/bin/blackbuck"
    assert_equal [RbConfig.ruby, "--yjit", "--yjit-exec-mem-size=64", script, *argv],
                 Allocator.command(argv, script: script, cmdline: cmdline, yjit: true, code_mib: 64)
    assert_equal [RbConfig.ruby, script, *argv], Allocator.command(argv, script: script, cmdline: cmdline, yjit: false, code_mib: nil)
  end

  def test_arena_cap
    a = allocator
    assert_nil a.arena_cap(nil, 1, jemalloc: nil), "one thread: glibc's own"
    assert_equal 2, a.arena_cap(nil, 4, jemalloc: nil), "threads: 2 by default"
    assert_equal 6, a.arena_cap(6, 1, jemalloc: nil), "an explicit value always"
    assert_nil a.arena_cap(6, 4, jemalloc: LIB), "jemalloc has its own arenas"
    env_set = allocator(env: { "MALLOC_ARENA_MAX" => "4" })
    assert_nil env_set.arena_cap(nil, 4, jemalloc: nil), "MALLOC_ARENA_MAX in the environment stands"
    assert_equal 3, env_set.arena_cap(3, 4, jemalloc: nil), "... unless malloc_arena_max is set"
  end

  def test_boot_says_jemalloc_is_installed_and_unused
    log = Log.new
    allocator.boot(config, log)
    assert_includes log.lines, [:info, "malloc: glibc; jemalloc is installed at #{@lib} and unused (set jemalloc true): " \
                                       "a small Rails app's worker USS was 30% lower on it, see docs/DEPLOY.md, Memory"]
    log = Log.new
    allocator(maps: maps(MAPS + JEMALLOC_LINE)).boot(config(jemalloc: true), log)
    assert_includes log.lines, [:info, "malloc: jemalloc (#{LIB})"]
  end

  # rackup and rails server: the app is loaded already, so no re-exec; the line says what to do.
  def test_boot_asked_for_jemalloc_not_loaded_tells_to_set_ld_preload
    log = Log.new
    allocator.boot(config(jemalloc: true), log)
    level, text = log.lines.first
    assert_equal :warn, level
    assert_match(/though jemalloc is set: .*rackup or rails server.*LD_PRELOAD=#{Regexp.escape(@lib)}/, text)
    assert_raises(Blackbuck::ConfigError) { allocator(paths: []).boot(config(jemalloc: true), Log.new) }
  end

  # (Native.malloc_arena_max(2) runs in this test process: harmless, it only caps new arenas.)
  def test_boot_logs_the_arena_cap
    log = Log.new
    allocator.boot(config(threads: 4), log)
    assert_includes log.lines, [:info, "malloc: at most 2 glibc arenas (the default with 4 app threads; set malloc_arena_max to change it)"]
    log = Log.new
    allocator.boot(config, log)
    refute(log.lines.any? { |_, t| t.include?("arenas") }, "one thread: no cap")
  end

  def test_config_keys
    c = Blackbuck::Config.new
    assert_equal [false, nil], [c[:jemalloc], c[:malloc_arena_max]]
    assert c.set(:jemalloc, "yes")[:jemalloc]
    assert_equal 4, c.set(:malloc_arena_max, "4")[:malloc_arena_max]
    assert_nil c.set(:malloc_arena_max, nil)[:malloc_arena_max]
    e = assert_raises(Blackbuck::ConfigError) { c.set(:malloc_arena_max, 0) }
    assert_equal "malloc_arena_max must be an integer 1..1024, got 0", e.message
    assert_raises(Blackbuck::ConfigError) { c.set(:jemalloc, "maybe") }
  end

  # Ruby 3.1's code region is the anonymous executable mapping (MAPS has one of 256 MiB).
  def test_yjit_code_region_from_the_maps
    assert_equal 256, Blackbuck::YJIT.code_mib(maps(MAPS), enabled: true)
    assert_nil Blackbuck::YJIT.code_mib(maps(MAPS), enabled: false)
    assert_nil Blackbuck::YJIT.code_mib(maps(MAPS.lines.reject { |l| l.include?("00:00 0\n") }.join), enabled: true)
  end
end
