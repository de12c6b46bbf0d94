# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# WorkerExits with a real scoreboard filled as workers fill it and stand-in exit statuses: why a
# reaped worker exited, as the master counts it for /status and /metrics (issue 32, item 10).
class WorkerExitsTest < Minitest::Test
  Child = Blackbuck::Children::Child
  WorkerExits = Blackbuck::WorkerExits

  # A Process::Status: an exit code, or the signal that killed it.
  Exit = Struct.new(:code, :sig) do
    def success? = sig.nil? && code.zero?
  end

  def setup
    @board = Blackbuck::Native::Scoreboard.new(2)
    @exits = WorkerExits.new(@board)
  end

  # Worker pid of slot index took its slot and said why it stops (nil: said nothing).
  def worker(index, pid, said = nil)
    @board.reset(index, pid)
    WorkerExits.say(@board, index, said) if said
    Child.new(index, pid, nil, 0.0, true)
  end

  def test_every_reason_is_counted_from_zero
    assert_equal WorkerExits::REASONS.to_h { |r| [r, 0] }, @exits.counts
  end

  def test_what_the_worker_said_and_what_the_master_knows
    assert_equal "recycle", @exits.exited(worker(0, 100, :recycle), Exit.new(0))
    assert_equal "memory", @exits.exited(worker(0, 101, :memory), Exit.new(0))
    assert_equal "timeout", @exits.exited(worker(0, 102, :timeout), Exit.new(0))
    assert_equal "timeout", @exits.exited(worker(0, 103), Exit.new(nil, "KILL"), timed_out: true),
                 "killed after the timeout's notice"
    assert_equal "crash", @exits.exited(worker(0, 104), Exit.new(nil, "KILL"))
    assert_equal "crash", @exits.exited(worker(0, 105, :recycle), Exit.new(1)), "it said recycle, then died"
    assert_equal "refork", @exits.exited(worker(0, 106, :retire), Exit.new(0))
    child = worker(1, 107, :retire)
    @exits.retiring(107)
    assert_equal "ttou", @exits.exited(child, Exit.new(0))
    assert_equal "other", @exits.exited(worker(0, 108), Exit.new(0))
    assert_equal "unsafe", @exits.exited(worker(0, 109, :unsafe), Exit.new(0))
    assert_equal "timeout", @exits.exited(worker(0, 110, :unsafe), Exit.new(0), timed_out: true),
                 "a timeout the app rescued: replaced as unsafe, counted as the timeout it was"
    assert_equal({ "crash" => 2, "timeout" => 3, "recycle" => 1, "memory" => 1, "ttou" => 1, "refork" => 1, "unsafe" => 1,
                   "other" => 1 },
                 @exits.counts)
  end

  # A worker that died before taking its slot: the slot still holds its predecessor's word.
  def test_a_slot_not_yet_taken_tells_nothing_of_the_worker
    worker(0, 200, :recycle)
    assert_equal "other", @exits.exited(Child.new(0, 201, nil, 0.0, false), Exit.new(0))
    assert_equal "crash", @exits.exited(Child.new(0, 202, nil, 0.0, false), Exit.new(1))
  end

  def test_an_unknown_reason_is_a_bug
    assert_raises(ArgumentError) { WorkerExits.say(@board, 0, :bored) }
  end
end
