# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "blackbuck/app_source"
require "stringio"

# Where the app comes from (preloaded by the master, or booted by a mold), and that the warm-up and
# the master's heap preparation run only where the app is held.
class AppSourceTest < Minitest::Test
  APP = ->(_env) { [200, {}, ["ok"]] }

  def setup
    @log = StringIO.new
    @logger = Blackbuck::Logger.new(@log)
    @warmed = []
  end

  # A config whose warm-up block records the app it was given.
  def config(warmup: true, gc_before_fork: true)
    config = Blackbuck::Config.new.set(:gc_before_fork, gc_before_fork)
    config.set(:warmup, ->(app) { @warmed << app }) if warmup
    config
  end

  def test_preloaded_warms_up_the_app_the_master_holds
    source = Blackbuck::AppSource.preloaded(APP, config)
    refute source.mold_boots?
    assert_same APP, source.app
    source.warm_up(@logger)
    assert_equal [APP], @warmed
    assert_match(/INFO warm-up: /, @log.string)
  end

  # streams with a Rails app whose per-request state is per thread: one WARN line naming the fix.
  def test_streams_with_a_rails_app_isolated_per_thread_is_warned_of
    level = Struct.new(:isolation_level)
    streams = Blackbuck::Config.new.set(:streams, true)
    warning = Blackbuck::AppSource.streams_warning(streams, isolation: level.new(:thread), rails: true)
    assert_match(/isolation_level is :thread.*isolation_level = :fiber/, warning)
    assert_match(/keeps it per thread/, Blackbuck::AppSource.streams_warning(streams, isolation: nil, rails: true),
                 "a Rails before 7.0 (no IsolatedExecutionState)")
    assert_nil Blackbuck::AppSource.streams_warning(streams, isolation: level.new(:fiber), rails: true)
    assert_nil Blackbuck::AppSource.streams_warning(streams, isolation: nil, rails: false), "not a Rails app"
    assert_nil Blackbuck::AppSource.streams_warning(Blackbuck::Config.new, isolation: level.new(:thread), rails: true),
               "streams off"
    assert_nil Blackbuck::AppSource.streams_warning(streams), "this process has no Rails"
  end

  def test_no_warm_up_line_when_none_is_configured
    Blackbuck::AppSource.preloaded(APP, config(warmup: false)).warm_up(@logger)
    assert_empty @log.string
  end

  def test_booted_by_mold_loads_nothing_in_the_master
    loads = 0
    source = Blackbuck::AppSource.booted_by_mold(-> { loads += 1; APP }, config) # rubocop:disable Style/Semicolon
    assert source.mold_boots?
    assert_nil source.app
    source.warm_up(@logger)
    source.prepare_heap(@logger)
    assert_equal 0, loads
    assert_empty @warmed
    assert_empty @log.string
  end

  def test_boot_loads_and_warms_up_naming_each_step
    steps = []
    source = Blackbuck::AppSource.booted_by_mold(-> { steps << :loaded; APP }, config) # rubocop:disable Style/Semicolon
    assert_same APP, source.boot(@logger, step: ->(s) { steps << s })
    assert_equal ["loading the app", :loaded, "the warm-up"], steps
    assert_equal [APP], @warmed
    assert source.mold_boots?, "the master still holds no app: every mold it forks boots it"
  end

  def test_load_in_master_makes_it_preloaded
    source = Blackbuck::AppSource.booted_by_mold(-> { APP }, config)
    assert_same APP, source.load_in_master(@logger)
    assert_equal [APP], @warmed
    refute source.mold_boots?
    assert_same APP, source.app
  end

  def test_prepare_heap_when_the_master_holds_the_app_and_gc_before_fork
    Blackbuck::AppSource.preloaded(APP, config(warmup: false, gc_before_fork: false)).prepare_heap(@logger)
    assert_empty @log.string
    Blackbuck::AppSource.preloaded(APP, config(warmup: false)).prepare_heap(@logger)
    assert_match(/INFO heap prepared for fork in \d+\.\d\d s: /, @log.string)
  end
end
