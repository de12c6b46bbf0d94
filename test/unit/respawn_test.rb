# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# Respawn without processes: stand-in exit statuses and a clock the test moves. What a worker's
# exit means (replace at once, after a back-off, or give up) and the log line that says so, as
# docs/SIGNALS.md (CHLD) tells operators.
class RespawnTest < Minitest::Test
  Child = Blackbuck::Children::Child
  Respawn = Blackbuck::Respawn

  class FakeLogger
    attr_reader :lines

    def initialize = @lines = []
    %i[info warn error].each { |level| define_method(level) { |msg| @lines << [level, msg] } }
  end

  # A Process::Status: an exit code, or the signal that killed it.
  Exit = Struct.new(:code, :sig) do
    def success? = sig.nil? && code.zero?
    def signaled? = !sig.nil?
    def termsig = Signal.list.fetch(sig)
    def exitstatus = code
  end

  # What #note_ready asks of Children.
  class FakeChildren
    include Enumerable

    def initialize(children, started) = (@children, @started = children, started)
    def each(&) = @children.each(&)
    def started?(child) = @started.include?(child.pid)
  end

  def setup
    @log = FakeLogger.new
    @now = 1000.0
    @respawn = Respawn.new(@log, clock: -> { @now })
  end

  def child(index = 0, pid = 100 + index, ready: false) = Child.new(index, pid, nil, @now, ready)

  def boot_failure(c = child, handing_over: false)
    @respawn.exited(c, Exit.new(1), started: false, stopping: false, handing_over: handing_over,
                                    why: "after_fork raised RuntimeError: boom")
  end

  def test_a_boot_failure_waits_longer_each_time_in_a_row
    waits = Array.new(6) do |i|
      refute boot_failure(child(0, 100 + i))
      assert @respawn.wait?
      wait = @log.lines.last[1][/replacing it in (\d+)s\z/, 1].to_i
      @now += wait - 0.01
      assert @respawn.wait?, "still waiting just before the #{wait}s are over"
      @now += 0.01
      refute @respawn.wait?
      wait
    end
    assert_equal [1, 2, 4, 8, 8, 8], waits
    assert_equal [:warn, "worker 0 (pid 100) exited with status 1 before it was ready (after_fork raised RuntimeError: " \
                         "boom; boot failure 1 of 10 in a row); replacing it in 1s"], @log.lines.first
  end

  def test_workers_that_fail_together_wait_once
    refute boot_failure(child(0))
    refute boot_failure(child(1))
    assert_match(/boot failure 2 of 10 in a row\); replacing it in 1s\z/, @log.lines.last[1])
  end

  def test_after_boot_attempts_in_a_row_the_workers_cannot_boot
    (Respawn::BOOT_ATTEMPTS - 1).times { |i| refute boot_failure(child(0, 100 + i)) }
    assert boot_failure(child(0, 200)), "the master is told to give up"
    assert_equal [:error, "workers cannot boot: after_fork raised RuntimeError: boom (10 attempts in a row); exiting"],
                 @log.lines.last
  end

  def test_while_a_reload_hands_over_it_keeps_trying
    Respawn::BOOT_ATTEMPTS.times do |i|
      refute boot_failure(child(0, 100 + i), handing_over: true)
      @now += Respawn::BACKOFF_MAX
    end
    assert_match(/boot failure 10 of 10 in a row\); replacing it in 8s\z/, @log.lines.last[1])
  end

  def test_a_worker_that_becomes_ready_starts_the_count_again
    3.times { |i| boot_failure(child(0, 100 + i)) }
    ready = child(1, 300)
    @respawn.note_ready(FakeChildren.new([child(0, 400), ready], [300]))
    assert ready.ready
    assert_equal 0, @respawn.failures
    @now += 10
    boot_failure(child(0, 500))
    assert_match(/boot failure 1 of 10 in a row\); replacing it in 1s\z/, @log.lines.last[1])
  end

  def test_the_reason_is_the_exit_when_the_worker_said_none
    @respawn.exited(child, Exit.new(nil, "KILL"), started: false, stopping: false, handing_over: false)
    assert_match(/\(pid 100\) killed by SIGKILL before it was ready \(killed by SIGKILL; boot failure 1/, @log.lines.last[1])
  end

  def test_a_ready_worker_that_dies_young_is_replaced_after_a_second
    refute @respawn.exited(child(1, 7, ready: true), Exit.new(nil, "KILL"), started: true, stopping: false,
                                                                            handing_over: false)
    assert_equal [:warn, "worker 1 (pid 7) killed by SIGKILL; replacing it"], @log.lines.last
    assert @respawn.wait?
    @now += Respawn::BACKOFF
    refute @respawn.wait?
    assert_equal 0, @respawn.failures, "a worker that was ready never counts as a boot failure"
  end

  def test_a_ready_worker_that_lived_is_replaced_at_once
    c = child(0, 8, ready: true)
    @now += 5
    @respawn.exited(c, Exit.new(3), started: true, stopping: false, handing_over: false)
    assert_equal [:warn, "worker 0 (pid 8) exited with status 3; replacing it"], @log.lines.last
    refute @respawn.wait?
  end

  # Ready, then gone before the master's next look: its slot shows it started.
  def test_a_worker_whose_slot_shows_it_started_was_ready
    c = child
    @respawn.exited(c, Exit.new(1), started: true, stopping: false, handing_over: false)
    assert c.ready
    assert_equal [:warn, "worker 0 (pid 100) exited with status 1; replacing it"], @log.lines.last
  end

  def test_while_stopping_nothing_is_replaced_or_counted
    @respawn.exited(child, Exit.new(1), started: false, stopping: true, handing_over: false)
    assert_equal [:warn, "worker 0 (pid 100) exited with status 1"], @log.lines.last
    assert_equal 0, @respawn.failures
  end

  def test_a_clean_exit_is_info
    @respawn.exited(child(0, 5, ready: true), Exit.new(0), started: true, stopping: false, handing_over: false)
    assert_equal [:info, "worker 0 (pid 5) exited with status 0"], @log.lines.last
    refute @respawn.wait?
  end
end
