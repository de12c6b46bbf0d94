# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# Scoreboard#read: a slot's numbers by name (issue 33, step 6), each from the C field it names.
class ScoreboardTest < Minitest::Test
  Scoreboard = Blackbuck::Native::Scoreboard

  def setup
    @board = Scoreboard.new(2)
  end

  def test_a_fresh_slot_reads_as_its_worker_left_it
    @board.reset(1, 4242)
    slot = @board.read(1)
    assert_kind_of Scoreboard::Slot, slot
    assert_predicate slot, :frozen?
    assert_equal [4242, Scoreboard::IDLE, 0, 0, 0, "", "", 0],
                 [slot.pid, slot.state, slot.requests, slot.running_ms, slot.connections, slot.request_method,
                  slot.path, slot.spill_bytes]
    assert_operator slot.heartbeat_age_ms, :>=, 0
    assert_equal 0, @board.read(0).pid, "the other slot is untouched"
  end

  def test_each_field_is_the_one_the_worker_wrote
    @board.reset(0, 4242)
    @board.request_observed(0, 0, 0.001)
    @board.tick(0, Scoreboard::STOPPING, 3)
    @board.running(0, Scoreboard::BUSY, 2.5, "POST", "/upload")
    slot = @board.read(0)
    assert_equal [4242, Scoreboard::BUSY, 1, 3, "POST", "/upload"],
                 [slot.pid, slot.state, slot.requests, slot.connections, slot.request_method, slot.path]
    assert_in_delta 2500, slot.running_ms, 1000, "started 2.5 s ago"
    @board.running(0, Scoreboard::IDLE, nil, nil, nil)
    slot = @board.read(0)
    assert_equal [Scoreboard::IDLE, 0], [slot.state, slot.running_ms], "no request runs"
  end

  def test_the_array_is_not_public
    refute_respond_to @board, :read_values
  end
end
