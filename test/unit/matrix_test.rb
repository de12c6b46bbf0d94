# frozen_string_literal: true

require "minitest/autorun"
require "tmpdir"
require "stringio"
require_relative "../matrix"

# The CI matrix (test/matrix.rb): where each lane's Ruby comes from, and that a lane whose Ruby is
# missing is said loudly and fails a CI run, without running anything.
class TestMatrixTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("bb-matrix")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # A stand-in `ruby` that says it is version v.
  def fake_ruby(v)
    bin = File.join(@dir, "ruby-#{v}", "bin")
    FileUtils.mkdir_p(bin)
    File.write(File.join(bin, "ruby"), "#!/bin/sh\nprintf '%s' '#{v}'\n")
    File.chmod(0o755, File.join(bin, "ruby"))
    bin
  end

  def test_the_variable_names_a_ruby_or_its_bin_directory
    lane = TestMatrix.lane("4.0")
    bin = fake_ruby("4.0")
    assert_equal [bin, nil], TestMatrix.find_ruby(lane, env: { "BLACKBUCK_RUBY_4_0" => bin, "PATH" => "" })
    assert_equal [bin, nil], TestMatrix.find_ruby(lane, env: { "BLACKBUCK_RUBY_4_0" => File.join(bin, "ruby"), "PATH" => "" })
  end

  def test_a_variable_naming_another_version_is_refused_with_its_reason
    lane = TestMatrix.lane("4.0")
    bin = fake_ruby("3.3")
    found, why = TestMatrix.find_ruby(lane, env: { "BLACKBUCK_RUBY_4_0" => bin, "PATH" => "" })
    assert_nil found
    assert_equal "BLACKBUCK_RUBY_4_0=#{bin} is not a Ruby 4.0 (3.3)", why
  end

  def test_every_lane_names_its_suites_and_the_primary_runs_them_all
    assert_equal %w[3.4 4.0 3.1], TestMatrix::LANES.map(&:version)
    primary = TestMatrix.lane("3.4").tasks
    %w[test test:slow test:hardening test:faults test:rails test:browser test:threads c:test fuzz:quick].each do |t|
      assert_includes primary, t
    end
    %w[4.0 3.1].each { |v| assert_empty(%w[compile test test:faults test:threads] - TestMatrix.lane(v).tasks, v) }
    assert_equal({ "RUBY_MN_THREADS" => "1" }, TestMatrix.lane("4.0").steps.find { |s| s.task == "test:threads" }.env)
  end

  def test_a_missing_lane_is_announced_and_fails_only_a_ci_run
    env = { "BLACKBUCK_LANES" => "4.0", "BLACKBUCK_RUBY_4_0" => File.join(@dir, "none"), "PATH" => "" }
    out = StringIO.new
    _, err = capture_io { assert TestMatrix.run(out: out, env: env), "outside CI: the other lanes decide" }
    assert_match(/LANE 4\.0 NOT RUN: BLACKBUCK_RUBY_4_0=.* is not a Ruby 4\.0 \(no ruby there\)/, err)
    assert_match(/0 lanes passed, 0 failed, 1 not run/, out.string)
    assert_equal "lanes: 0 passed, 0 failed, 1 skipped\n", out.string.lines.last
    out = StringIO.new
    capture_io { refute TestMatrix.run(out: out, env: env.merge("CI" => "true")) }
    assert_match(/1 not run \(CI=true: a lane not run fails the run\)/, out.string)
    assert_equal "lanes: 0 passed, 1 failed\n", out.string.lines.last
  end

  def test_unknown_lanes_are_refused
    e = assert_raises(ArgumentError) { TestMatrix.selected(env: { "BLACKBUCK_LANES" => "3.4 2.7" }) }
    assert_equal "BLACKBUCK_LANES names 2.7: the lanes are 3.4, 4.0, 3.1", e.message
  end

  def test_each_ruby_but_debians_gets_its_own_lockfile
    wrapper = TestMatrix.gemfile("gemfiles/rails7.gemfile", version: "3.4")
    assert_match %r{tmp/gemfiles/ruby-3\.4/rails7\.gemfile\z}, wrapper
    assert_includes File.read(wrapper), %(eval_gemfile #{File.join(TestMatrix::ROOT, 'gemfiles/rails7.gemfile').inspect})
    assert_equal File.join(TestMatrix::ROOT, "gemfiles/rails7.gemfile"), TestMatrix.gemfile("gemfiles/rails7.gemfile", version: "3.1")
  end
end
