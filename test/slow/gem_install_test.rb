# frozen_string_literal: true

require_relative "../test_helper"
require "rubygems/package"
require_relative "../../lib/blackbuck/version"

# What a user gets from `gem build` + `gem install`: both commands, with the C extension and
# blackbuck-load built at install time (no Rakefile there), run from a clean environment (no
# Bundler, no checkout on the load path). rack comes from the gems already on the machine:
# nothing touches the network.
class GemInstallTest < Minitest::Test
  BUILD_LIMIT = 60    # seconds for `gem build`
  INSTALL_LIMIT = 240 # seconds for `gem install` (two C builds; about 10 s on an idle 2-core machine)
  RUN_LIMIT = 30      # seconds for any other command
  # Built by `rake compile` or by an extconf run in the tree: never shipped in the gem.
  GENERATED = %r{\.(o|so|bundle|log)\z|\Aloadgen/(blackbuck-load|gem\.mk)\z|\Aloadgen/build/|\Aext/.*/Makefile\z}

  def setup
    @tmp = Dir.mktmpdir("bb-gem")
    @home = File.join(@tmp, "home")
    @gems = File.join(@tmp, "gems")
    Dir.mkdir(@home)
    @logs = []
    @server = nil
  end

  def teardown
    @server&.stop
    unless passed?
      @logs.each { |path| warn "\n--- #{File.basename(path)} ---\n#{File.read(path)}--- end ---" if File.exist?(path) }
      warn "\n--- server log ---\n#{@server.log}--- end ---" if @server
    end
    FileUtils.rm_rf(@tmp)
  end

  def test_gem_install_builds_the_extension_and_blackbuck_load_and_both_commands_run
    gem_file = File.join(@tmp, "blackbuck.gem")
    out = run!("gem build", *gem_command("build", "blackbuck.gemspec", "-o", gem_file), chdir: ROOT, limit: BUILD_LIMIT)
    warnings = out.lines.grep(/WARNING/).reject { |l| l.include?("no homepage") || l.include?("specification-reference") }
    assert_empty warnings, "gem build warned:\n#{out}"
    assert_gem_files(Gem::Package.new(gem_file).spec)

    # With ri documentation, as a plain `gem install` makes it: RDoc reads every source file, and
    # reads a C comment line such as "#define X /* Transfer-Encoding: chunked */" as a magic
    # encoding comment ("unknown encoding name "chunked" for ext/blackbuck/bb_http.h, skipping").
    out = run!("gem install", *gem_command("install", "--local", "--document", "ri", "--ignore-dependencies",
                                           "--install-dir", @gems, gem_file), limit: INSTALL_LIMIT)
    assert_match(/^Installing ri documentation for blackbuck/, out)
    assert_empty out.lines.grep(/encoding|skipping|rdoc.*(warn|error)/i), "gem install warned:\n#{out}"
    # RubyGems 3.4+ runs `make clean` after `make install`, which removes what `make` built in the
    # gem's loadgen/: the command must work from the installed copy alone, whatever RubyGems did.
    gem_dir = File.join(@gems, "gems", "blackbuck-#{Blackbuck::VERSION}")
    run!("make clean", "make", "-C", File.join(gem_dir, "loadgen"), "clean")
    refute File.exist?(File.join(gem_dir, "loadgen", "blackbuck-load"))

    assert_equal "blackbuck #{Blackbuck::VERSION}\n", run!("blackbuck --version", bin("blackbuck"), "--version")
    assert_match(/\Ablackbuck-load \d+\.\d+\.\d+ /, run!("blackbuck-load --version", bin("blackbuck-load"), "--version"))

    sock = File.join(@tmp, "app.sock")
    @server = ChildProcess.new([bin("blackbuck"), "-w", "1", "-l", "unix:#{sock}", File.join(APPS, "hello.ru")],
                               log_path: File.join(@tmp, "server.log"), env: clean_env)
    wait_until("the installed blackbuck's worker is ready") { @server.log.match?(/worker 0 \(pid \d+\) ready/) }
    report = run!("blackbuck-load run", bin("blackbuck-load"), "-t1", "-c4", "-d1s", "-P", sock, "http://localhost/")
    requests = report[/^  (\d+) requests in /, 1].to_i
    assert_operator requests, :>, 0, report
    refute_match(/Socket errors|Non-2xx/, report)
    @server.stop
    assert @server.status&.success?, "the installed server stops cleanly on TERM"

    installed = Dir[File.join(@gems, "extensions/*/*/blackbuck-#{Blackbuck::VERSION}/blackbuck/blackbuck-load")]
    assert_equal 1, installed.size, "make install put blackbuck-load in the gem's extension directory"

    # A broken install (the binary gone): one clear line and exit 1, not a backtrace.
    FileUtils.rm_f([*installed, File.join(gem_dir, "lib/blackbuck/blackbuck-load")])
    status, out = run_cmd(bin("blackbuck-load"), "--version")
    assert_equal 1, status.exitstatus, out
    assert_equal 1, out.lines.size, out
    assert_match(/\Ablackbuck-load: the load generator is not built/, out)
  end

  private

  # What the build needs is in the gem, and nothing built from it.
  def assert_gem_files(spec)
    files = spec.files
    needed = %w[loadgen/Makefile loadgen/extconf.rb ext/blackbuck/extconf.rb exe/blackbuck exe/blackbuck-load] +
             Dir.glob(["loadgen/src/*.{c,h}", "ext/blackbuck/*.{c,h}"], base: ROOT)
    assert_empty needed - files, "missing from the gem"
    assert_equal ["MIT"], spec.licenses
    assert_includes files, "LICENSE"
    assert_match(/\AMIT License\n/, File.read(File.join(ROOT, "LICENSE")), "the license text the gemspec names")
    assert_empty files.grep(GENERATED), "generated files in the gem"
    return unless system("git", "-C", ROOT, "rev-parse", "--git-dir", out: File::NULL, err: File::NULL)

    ignored = IO.popen(["git", "-C", ROOT, "check-ignore", "--stdin"], "r+") do |io|
      io.write(files.join("\n"))
      io.close_write
      io.read
    end
    assert_empty ignored.lines, "files git ignores (build products) in the gem"
  end

  # The `gem` command of the Ruby running this test (what /usr/bin/gem itself runs, if it is missing).
  def gem_command(*args)
    script = File.join(RbConfig::CONFIG["bindir"], "gem")
    runner = File.exist?(script) ? [script] : ["-rrubygems/gem_runner", "-e", "Gem::GemRunner.new.run(ARGV)", "--"]
    [RbConfig.ruby, *runner, *args]
  end

  def bin(name) = File.join(@gems, "bin", name)

  # No Bundler (BUNDLE_*, RUBYOPT=-rbundler/setup), no RUBYLIB, no user gemrc: every variable
  # of ours is unset except these. rack resolves from where this process found it.
  def clean_env
    rack = Gem::Specification.find_by_name("rack", ">= 2.2", "< 4")
    keep = ENV.to_h.slice("PATH", "TMPDIR", "LANG", "LC_ALL")
    ENV.keys.to_h { |k| [k, nil] }.merge(keep).merge(
      "HOME" => @home, "GEM_HOME" => @gems, "GEM_PATH" => [@gems, rack.base_dir].uniq.join(File::PATH_SEPARATOR)
    )
  end

  # Runs cmd in its own process group with a clean environment; [status, output] (stdout and
  # stderr together, in order). The group is killed, by pid, if it outlives limit.
  def run_cmd(*cmd, chdir: @tmp, limit: RUN_LIMIT)
    log = File.join(@tmp, "cmd-#{@logs.size}.log")
    @logs << log
    pid = Process.spawn(clean_env, *cmd, out: [log, "w"], err: %i[child out], in: File::NULL, pgroup: true, chdir: chdir)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + limit
    until (status = Process.wait2(pid, Process::WNOHANG)&.last)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        begin
          Process.kill(:KILL, -pid)
        rescue Errno::ESRCH
          nil
        end
        Process.wait(pid)
        flunk "#{cmd.join(' ')} did not finish within #{limit} s:\n#{File.read(log)}"
      end
      sleep 0.05
    end
    [status, File.read(log)]
  end

  def run!(what, *cmd, **opts)
    status, out = run_cmd(*cmd, **opts)
    assert status.success?, "#{what} failed (#{status}):\n#{out}"
    out
  end

  def wait_until(what, limit = RUN_LIMIT)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + limit
    until yield
      flunk "#{what}: not within #{limit} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      flunk "#{what}: the server exited" if @server.exited?
      sleep 0.05
    end
  end
end
