# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# Issue 32, item 6: bin/setup and bench/setup, run for real with the commands that reach the
# network or the system (bundle, apt-get, gem, ...) replaced on PATH by stand-ins that record
# how they were called. The demo's light path installs only this Ruby's bundle and builds the
# extension; a benchmark peer that failed to install is not tried again with the same Ruby.
class SetupScriptsTest < Minitest::Test
  SCRIPT_TIMEOUT = 60 # seconds: a bound for a script that went wrong (the stand-ins answer at once)

  def setup
    @dir = Dir.mktmpdir("bb-test-setup")
    @bin = File.join(@dir, "bin")
    @calls = File.join(@dir, "calls.log")
    FileUtils.mkdir_p(@bin)
    FileUtils.touch(@calls)
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # `bin/setup --demo`: the bundle and the extension, nothing of the test matrix, apt or the benchmark.
  def test_setup_demo_installs_only_the_bundle_and_the_extension
    %w[bundle ruby gem apt-get sudo make].each { |name| stand_in(name) }
    out, err, status = run_script(File.join(ROOT, "bin/setup"), "--demo")
    assert status.success?, "#{out}#{err}"
    assert_equal ["bundle install --quiet", "bundle exec rake compile"], calls
    assert_match(%r{bundle exec blackbuck demo/config\.ru}, out)
  end

  def test_setup_refuses_an_unknown_argument
    %w[bundle ruby gem apt-get sudo make].each { |name| stand_in(name) }
    _out, err, status = run_script(File.join(ROOT, "bin/setup"), "--dmeo")
    assert_equal 2, status.exitstatus
    assert_equal "bin/setup: unknown argument --dmeo (bin/setup, or bin/setup --demo)\n", err
    assert_empty calls
  end

  # A gem that cannot install (Falcon needs a newer Ruby than 3.1) is recorded absent with its
  # reason, and the next run does not try it again; BENCH_RETRY_ABSENT=1 does.
  def test_bench_setup_does_not_retry_a_peer_that_failed_on_this_ruby
    stand_in("gem", <<~SH)
      case "$1" in
        list) exit 1 ;;
        install)
          if [ "$3" = falcon ]; then echo "ERROR:  Error installing falcon:"; echo "	falcon requires Ruby version >= 3.2."; exit 1; fi ;;
      esac
    SH
    stand_in("dpkg-query", %(printf "install ok installed"))
    %w[apt-get sudo make].each { |name| stand_in(name) }
    gems = File.join(@dir, "gems")
    env = { "BENCH_GEM_HOME" => gems }

    out, err, = run_script(File.join(ROOT, "bench/setup"), env: env)
    assert_equal 1, falcon_installs, "the first run tries it:\n#{out}#{err}"
    assert_match(/falcon requires Ruby version >= 3\.2\./, File.read("#{gems}/absent/falcon.txt"))

    out, = run_script(File.join(ROOT, "bench/setup"), env: env)
    assert_equal 1, falcon_installs, "the second run does not:\n#{out}"
    assert_match(/falcon -v '0\.57\.0' absent on Ruby \S+ \(failed before: .*falcon requires Ruby version >= 3\.2\.\); not tried again/, out)
    assert_operator calls.grep(/\Agem install --no-document puma /).size, :>=, 2, "a gem not installed is tried each run"

    run_script(File.join(ROOT, "bench/setup"), env: env.merge("BENCH_RETRY_ABSENT" => "1"))
    assert_equal 2, falcon_installs, "BENCH_RETRY_ABSENT=1 tries it again"
  end

  private

  # An executable `name` first on PATH that records "name ARGS" in calls.log, then runs body.
  def stand_in(name, body = "")
    path = File.join(@bin, name)
    File.write(path, "#!/bin/sh\necho \"#{name} $*\" >> #{@calls}\n#{body}\nexit 0\n")
    File.chmod(0o755, path)
  end

  def calls = File.readlines(@calls, chomp: true)

  def falcon_installs = calls.grep(/\Agem install --no-document falcon /).size

  def run_script(*cmd, env: {})
    full = { "PATH" => "#{@bin}:#{ENV.fetch('PATH')}", "BUNDLE_GEMFILE" => nil }.merge(env)
    Timeout.timeout(SCRIPT_TIMEOUT) { Open3.capture3(full, *cmd, chdir: ROOT) }
  end
end
