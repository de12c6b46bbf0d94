# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# Reload's decisions that need no exec: HUP without the blackbuck command, a HUP during a handover,
# retiring the previous image's workers, ending the stand-in. The re-exec itself is test/slow's
# (reload_test.rb, hot_deploy_test.rb).
class ReloadHupTest < Minitest::Test
  class FakeLogger
    attr_reader :lines

    def initialize = @lines = []
    %i[info warn error].each { |level| define_method(level) { |msg| @lines << msg } }
  end

  # What Reload asks of Children.
  class FakeChildren
    attr_accessor :handing_over, :started, :old
    attr_reader :told, :signals

    def initialize = (@told, @signals, @handing_over, @started, @old = 0, [], false, false, 2)
    def tell_all = @told += 1
    def handing_over? = @handing_over
    def all_started?(_wanted) = @started
    def stop_old = @old
    def size = 2
    def signal(sig, pid) = @signals << [sig, pid]
  end

  def setup
    @log = FakeLogger.new
    @kids = FakeChildren.new
    @signals = Blackbuck::SignalQueue.new(Blackbuck::Supervisor::SIGNALS)
    @reload = Blackbuck::Reload.new(server: nil, config: {}, logger: @log, notify: nil, children: @kids,
                                    listeners: [], signals: @signals)
    @command = Blackbuck::Reexec.command
  end

  def teardown
    Blackbuck::Reexec.command = @command
    @signals.close_in_child
  end

  def test_without_the_blackbuck_command_a_hup_replaces_the_workers
    Blackbuck::Reexec.command = nil
    @reload.hup(nil) { flunk "no boot check" }
    assert_equal 1, @kids.told
    assert_equal ["HUP: replacing every worker (started without the blackbuck command: no code reload)"], @log.lines
  end

  def test_a_hup_during_a_handover_waits_and_hups_that_arrive_meanwhile_make_one
    Blackbuck::Reexec.command = %w[ruby blackbuck]
    @kids.handing_over = true
    2.times { @reload.hup(nil) { flunk "no boot check while handing over" } }
    assert @reload.pending?
    assert_equal ["HUP: the previous reload's new workers are still starting; reloading once they serve"], @log.lines
    assert_equal 0, @kids.told
  end

  def test_the_old_workers_retire_once_every_new_one_serves
    @reload.retire_old_workers(2)
    @kids.handing_over = true
    @reload.retire_old_workers(2)
    assert_empty @log.lines, "not before every new worker serves"
    @kids.started = true
    @reload.retire_old_workers(2)
    assert_equal ["new workers ready; 2 old workers finishing"], @log.lines
  end

  def test_the_new_image_ends_the_old_ones_status_stand_in
    ENV[Blackbuck::Reexec::STANDIN_ENV] = "4242"
    @reload.end_standin
    assert_equal [[:TERM, 4242]], @kids.signals
    assert_nil ENV[Blackbuck::Reexec::STANDIN_ENV], "not handed on to the next image"
    @reload.end_standin
    assert_equal [[:TERM, 4242]], @kids.signals
  ensure
    ENV.delete(Blackbuck::Reexec::STANDIN_ENV)
  end
end
