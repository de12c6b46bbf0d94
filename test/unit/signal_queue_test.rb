# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# The master's signal queue without traps (those are test/slow's): what a trap pushes wakes the
# loop and is taken in order.
class SignalQueueTest < Minitest::Test
  def setup = @signals = Blackbuck::SignalQueue.new(Blackbuck::Supervisor::SIGNALS)
  def teardown = @signals.close_in_child

  def woken? = !IO.select([@signals.wake_io], nil, nil, 0).nil?

  def test_a_pushed_signal_wakes_the_loop_and_is_taken_in_order
    refute woken?
    @signals.push(:HUP)
    @signals.push(:TERM)
    assert woken?
    @signals.clear_wake
    refute woken?, "the bytes that woke it are read"
    assert_equal :HUP, @signals.shift
    assert_equal :TERM, @signals.shift
    assert_nil @signals.shift
  end

  def test_what_is_queued_stays_queued_when_looked_at
    @signals.push(:TTIN)
    @signals.push(:QUIT)
    assert @signals.queued?(%i[TERM INT QUIT])
    refute @signals.queued?(%i[HUP])
    @signals.pending.clear
    assert_equal %i[TTIN QUIT], @signals.pending
  end

  def test_many_signals_never_block_a_trap
    10_000.times { @signals.push(:CHLD) } # more bytes than a pipe holds
    assert_equal 10_000, @signals.pending.size
  end

  def test_a_child_closes_the_pipe
    @signals.close_in_child
    assert @signals.wake_io.closed?
  end

  # A signal the master received but had not handled when it forked runs the master's trap in the
  # child, after the child closed the pipe (the status stand-in, seen on Ruby 4.0): no IOError.
  def test_a_trap_run_after_the_pipe_is_closed_raises_nothing
    @signals.close_in_child
    @signals.push(:HUP)
    assert_equal [:HUP], @signals.pending
  end
end
