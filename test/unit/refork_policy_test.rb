# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# ReforkPolicy alone: real Children (roles and states) over a scoreboard stand-in whose slots the
# test writes; no process, pipe or socket. (Refork carrying the steps out: refork_test.rb.)
class ReforkPolicyTest < Minitest::Test
  Policy = Blackbuck::ReforkPolicy
  Children = Blackbuck::Children
  STOPPING = Blackbuck::Native::Scoreboard::STOPPING
  IDLE = Blackbuck::Native::Scoreboard::IDLE

  Slot = Struct.new(:pid, :state, :requests)

  # Scoreboard#read's stand-in: slot index => Slot.
  class Board
    def initialize = @slots = Hash.new { |h, i| h[i] = Slot.new(0, IDLE, 0) }
    def read(index) = @slots[index]
    def []=(index, slot)
      @slots[index] = slot
    end
  end

  def setup
    @board = Board.new
    @kids = Children.new(@board, nil)
    @policy = Policy.new([10, 20], @board)
  end

  # A worker of slot index that has taken its slot (started: false, still forking) and served `served`.
  def worker(index, pid, served: 0, generation: 0, started: true, state: IDLE)
    @kids.add(Children::Child.new(index, pid, nil, 0.0, started, generation, :master))
    @board[index] = Slot.new(started ? pid : 0, state, served)
    @kids[pid]
  end

  def step(wanted = 2, quiet: false) = @policy.next_step(@kids, wanted, quiet: quiet)&.then { |s| [s.action, s.child.pid] }

  def mold(pid, state: :serving, booted: false)
    @kids.add_mold(Children::MoldChild.new(pid, nil, @policy.generation, booted, state))
  end

  def test_the_first_worker_past_its_count_forks_the_mold_and_one_step_at_a_time
    worker(0, 100, served: 3)
    worker(1, 101, served: 10)
    assert_equal [:promote, 101], step
    @kids[101].state = :promoting # (Children#tell_stop)
    assert_nil step, "one promotion at a time"
    assert_nil step(2, quiet: true)
  end

  def test_nothing_while_a_slot_has_no_serving_worker_or_a_step_is_under_way
    worker(0, 100, served: 50)
    assert_nil step(2), "slot 1 is empty"
    worker(1, 101, started: false)
    assert_nil step(2), "slot 1's worker is still starting"
    @board[1] = Slot.new(101, IDLE, 0)
    assert_equal [:promote, 100], step(2)
    %i[retiring leaving].each do |busy|
      @kids[101].state = busy
      assert_nil step(2), "a worker is #{busy}"
    end
  end

  def test_after_a_refork_the_previous_generation_retires_one_at_a_time_then_the_next_count_applies
    worker(0, 100, served: 12)
    worker(1, 101, served: 30)
    @kids[100].state = :promoting
    refute @policy.adopted(booted: false), "a new generation, not a replacement"
    assert_equal 1, @policy.generation
    @kids[100].state = :leaving
    assert_nil step, "the worker that forked the mold still leaves"
    @kids.delete(100)
    worker(0, 200, generation: 1, served: 19)
    assert_equal [:retire, 101], step
    @kids[101].state = :retiring
    assert_nil step
    @kids.delete(101)
    worker(1, 201, generation: 1)
    assert_nil step, "generation 1's count is 20"
    @board[0] = Slot.new(200, IDLE, 20)
    assert_equal [:promote, 200], step
    @kids[200].state = :promoting
    @policy.adopted(booted: false)
    @kids.delete(200)
    worker(0, 300, generation: 2, served: 1_000)
    @kids.delete(201)
    worker(1, 301, generation: 2, served: 1_000)
    assert_nil step, "the list is exhausted: the generation stays"
  end

  # The master does not hold the app: a mold booted it, and one that dies is forked by a worker.
  def test_a_mold_that_dies_is_replaced_by_a_serving_worker_of_the_generation_and_keeps_it
    @policy.lean!
    assert @policy.boot_due?(@kids, 0), "nothing booted yet: a mold boots the app"
    mold(50, state: :booting)
    refute @policy.boot_due?(@kids, 0), "one boot at a time"
    refute @policy.adopted(booted: true)
    worker(0, 100, state: STOPPING)
    worker(1, 101)
    worker(2, 102, started: false)
    refute @policy.boot_due?(@kids, 0), "a mold boots the app once: a worker forks the next"
    @kids.instance_variable_get(:@molds).delete(50) # it died
    @policy.mold_lost
    assert_equal [:replace, 101], step(3), "not the stopping worker, not the starting one"
    assert_equal :worker, @policy.successor
    @kids[101].state = :promoting
    assert_nil step(3)
    assert @policy.adopted(booted: false), "it replaces the mold: the generation stays"
    assert_equal 0, @policy.generation
  end

  def test_workers_that_exit_without_replacing_the_mold_give_way_to_a_boot
    @policy.lean!
    mold(50, state: :booting)
    @policy.adopted(booted: true)
    @kids.instance_variable_get(:@molds).delete(50)
    @policy.mold_lost
    Policy::REPLACE_ATTEMPTS.times do |i|
      child = worker(0, 100 + i)
      assert_equal [:replace, 100 + i], step(1)
      child.state = :promoting
      refute @policy.boot_due?(@kids, 0)
      @kids.delete(child.pid)
      assert @policy.promotion_ended(mold: false), "a failure to replace the mold"
    end
    assert_equal :boot, @policy.successor
    worker(0, 200)
    assert_nil step(1), "no worker is told again"
    assert @policy.boot_due?(@kids, 0)
  end

  def test_no_worker_serving_to_fork_the_mold_lets_one_boot_the_app
    @policy.lean!
    mold(50, state: :booting)
    @policy.adopted(booted: true)
    @kids.instance_variable_get(:@molds).delete(50)
    @policy.mold_lost
    worker(0, 100, started: false)
    refute @policy.boot_due?(@kids, 0), "a worker may yet fork it"
    assert_nil step(1)
    assert @policy.boot_due?(@kids, 0), "a turn found none serving"
  end

  def test_a_boot_that_fails_is_fatal_first_and_then_backs_off
    assert_nil @policy.boot_failed(0), "the first boot: the server cannot start"
    @policy.adopted(booted: true)
    waits = Array.new(7) { @policy.boot_failed(100) }
    assert_equal [1, 2, 5, 10, 30, 30, 30], waits
    @policy.lean!
    assert_nil step(1), "no worker to fork a mold"
    refute @policy.boot_due?(@kids, 100 + 29)
    assert @policy.boot_due?(@kids, 100 + 30)
    @policy.adopted(booted: true)
    assert_equal 1, @policy.boot_failed(0), "a boot that succeeded resets the back-off"
  end

  def test_an_app_that_is_not_fork_safe_ends_the_promotions
    worker(0, 100, served: 50)
    @policy.unsafe
    refute @policy.reforking?
    assert_nil step(1)
  end

  def test_it_holds_no_io_and_sends_nothing
    source = File.read(File.expand_path("../../lib/blackbuck/master/refork_policy.rb", __dir__))
    code = source.lines.map { |l| l.sub(/#.*/, "") }.join # (no string in it holds a #)
    assert_operator source.lines.size, :<=, 160
    refute_match(/Process|Messages|Socket|IO\b|\.send|@logger|tell_stop|\bfork\b|\bnow\b *=|clock_gettime/, code)
  end
end
