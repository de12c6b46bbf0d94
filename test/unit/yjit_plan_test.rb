# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck/yjit"

# YJIT.plan: what the master does about `yjit` and `yjit_mem_size` for each Ruby and state, without
# starting anything.
class YjitPlanTest < Minitest::Test
  YJIT = Blackbuck::YJIT
  RUBY40 = { available: true, enabled: false, takes_mem_size: true, started_with: nil, can_enable: true }.freeze
  RUBY34 = RUBY40.merge(takes_mem_size: false).freeze
  RUBY31 = RUBY34.merge(can_enable: false).freeze

  def plan(ruby, want: false, mib: nil, reexec: true, **state) = YJIT.plan(want: want, mib: mib, reexec: reexec, **ruby, **state)

  def test_nothing_asked_nothing_done
    assert_equal [:nothing], plan(RUBY40)
    assert_equal [:nothing], plan(RUBY31.merge(available: false))
  end

  def test_ruby_4_starts_it_in_place_with_the_limit
    assert_equal [:enable, 64], plan(RUBY40, mib: 64)
    assert_equal [:enable, nil], plan(RUBY40, want: true)
    assert_equal [:enable, 64], plan(RUBY40, mib: 64, reexec: false), "rackup: in place as well"
  end

  def test_ruby_3_4_and_3_1_exec_again_for_the_limit
    assert_equal [:reexec, nil], plan(RUBY34, mib: 64)
    assert_equal [:reexec, nil], plan(RUBY31, mib: 64)
    assert_equal [:enable, nil], plan(RUBY34, want: true), "3.3+ has RubyVM::YJIT.enable"
    assert_equal [:reexec, nil], plan(RUBY31, want: true), "3.1 has no RubyVM::YJIT.enable"
  end

  def test_after_the_reexec_the_limit_is_found_on_the_command_line
    assert_equal [:nothing], plan(RUBY34, mib: 64, enabled: true, started_with: ["--yjit-mem-size", 64], reexecuted: true)
    step, text = plan(RUBY34, mib: 64, enabled: true, started_with: ["--yjit-mem-size", 32], reexecuted: true)
    assert_equal :warn, step, "never a second exec"
    assert_match(/yjit_mem_size 64 is not applied: YJIT was started before the config was read with --yjit-mem-size=32/, text)
    assert_equal [:error, "yjit is set, but YJIT did not start after a restart with --yjit"], plan(RUBY34, mib: 64, reexecuted: true)
  end

  def test_already_running_without_the_limit_execs_again_unless_the_app_is_loaded
    assert_equal [:reexec, nil], plan(RUBY34, mib: 64, enabled: true)
    assert_equal [:nothing], plan(RUBY34, want: true, enabled: true)
    step, text = plan(RUBY40, mib: 64, enabled: true, reexec: false)
    assert_equal :warn, step
    assert_match(/start Ruby with RUBYOPT="--yjit-mem-size=64"|RUBYOPT="--yjit-exec-mem-size=64"/, text)
  end

  def test_rackup_on_3_4_says_how_to_start
    step, text = plan(RUBY34, mib: 64, reexec: false)
    assert_equal :warn, step
    assert_match(/yjit_mem_size 64 is set, but this server was started by rackup or rails server with the app loaded: start it with RUBYOPT="--yjit --yjit-(exec-)?mem-size=64"/, text)
  end

  def test_no_yjit_in_this_ruby_is_an_error
    assert_equal [:error, "yjit_mem_size 64 is set, but this Ruby has no YJIT (built without it)"],
                 plan(RUBY34.merge(available: false), mib: 64)
  end

  def test_the_limit_the_process_started_with
    assert_equal ["--yjit-mem-size", 48], YJIT.started_with(cmdline: %w[ruby --yjit --yjit-mem-size=48 x], rubyopt: "")
    assert_equal ["--yjit-exec-mem-size", 64], YJIT.started_with(cmdline: %w[ruby x], rubyopt: "-W0 --yjit-exec-mem-size=64")
    assert_nil YJIT.started_with(cmdline: %w[ruby --yjit x], rubyopt: "")
  end
end
