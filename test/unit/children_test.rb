# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# Children without forking: Child entries with real control pipes and a real scoreboard whose
# slots the test fills as workers would. (Reaping needs real processes: test/slow covers it.)
class ChildrenTest < Minitest::Test
  Children = Blackbuck::Children
  Messages = Blackbuck::Messages

  def setup
    @board = Blackbuck::Native::Scoreboard.new(4)
    @ios = []
  end

  def teardown = @ios.each { |io| io.close unless io.closed? }

  def pipe = IO.pipe.tap { |pair| @ios.concat(pair) }

  # A worker of slot index; its control pipe's read end (what the worker watches).
  def worker(children, index, pid)
    r, w = pipe
    children.add(Children::Child.new(index, pid, w, 0.0, false))
    r
  end

  def children(old = {}) = Children.new(@board, nil, old)

  def test_a_worker_has_started_once_its_slot_is_its_own
    kids = children
    worker(kids, 0, 100)
    worker(kids, 1, 101)
    refute kids.serving?
    refute kids.all_started?(2)
    @board.reset(0, 100)
    assert kids.started?(kids[100])
    refute kids.started?(kids[101])
    assert kids.serving?
    assert_equal [0], kids.live_slots
    refute kids.all_started?(2)
    @board.reset(1, 101)
    assert kids.all_started?(2)
    refute kids.all_started?(3), "fewer workers than wanted"
  end

  def test_workers_are_told_to_stop_on_their_control_pipe
    kids = children
    r0 = worker(kids, 0, 100)
    r1 = worker(kids, 1, 101)
    kids.tell_stop(kids[100])
    assert_equal Messages::STOP, Messages.receive_control(r0)
    kids.tell_all(Messages::FORCE)
    assert_equal Messages::FORCE, Messages.receive_control(r0)
    assert_equal Messages::FORCE, Messages.receive_control(r1)
    kids[100].control.close
    kids.tell_stop(kids[100]) # a closed pipe is no error
  end

  def test_the_previous_images_workers_are_stopped_once_and_listed_until_reaped
    r_old, w_old = pipe
    kids = children({ 200 => w_old, 201 => nil }) # 201: told to stop by an earlier image
    worker(kids, 0, 100)
    assert kids.handing_over?
    assert kids.serving?, "the old image's workers serve meanwhile"
    assert_equal [100, 200, 201], kids.pids.sort
    assert_equal 1, kids.stop_old
    assert_equal Messages::STOP, Messages.receive_control(r_old)
    assert w_old.closed?
    refute kids.handing_over?
    assert_equal [100, 200, 201], kids.pids.sort, "listed until reaped"
    refute kids.all_gone?
    assert_equal 0, kids.stop_old
  end

  def test_the_next_image_gets_every_workers_pipe
    _r, w_old = pipe
    kids = children({ 200 => w_old, 201 => nil })
    worker(kids, 0, 100)
    assert_equal [[100, kids[100].control], [200, w_old], [201, nil]], kids.for_exec
  end

  def test_a_process_forked_from_the_master_closes_every_pipe
    _r, w_old = pipe
    kids = children({ 200 => w_old })
    worker(kids, 0, 100)
    kids.close_in_child
    assert kids[100].control.closed?
    assert w_old.closed?
    assert_equal 1, kids.size, "still listed: the copy in the child is not the master's"
  end

  def test_enumerates_this_images_workers
    kids = children({ 200 => nil })
    worker(kids, 1, 101)
    worker(kids, 0, 100)
    assert_equal [0, 1], kids.map(&:index).sort
    assert_equal [0, 1], kids.sort_by(&:index).map(&:index)
    refute kids.all_gone?
  end

  def test_a_worker_starts_then_serves_and_its_state_says_what_it_was_told
    kids = children
    reads = { 100 => worker(kids, 0, 100), 101 => worker(kids, 1, 101) }
    assert_equal %i[starting starting], kids.sort_by(&:index).map(&:state)
    @board.reset(0, 100)
    assert kids.started?(kids[100])
    assert_equal :serving, kids[100].state
    kids.tell_stop(kids[100], Messages::PROMOTE)
    assert_equal [:promoting, Messages::PROMOTE], [kids[100].state, Messages.receive_control(reads[100])]
    assert_equal kids[100], kids.in_state(:promoting)
    kids.tell_stop(kids[100], Messages::RETIRE)
    assert_equal :promoting, kids[100].state, "a worker forking the mold is not a retiring one (TTOU)"
    kids.serves_on(100)
    assert_equal :serving, kids[100].state
    kids.tell_stop(kids[101], Messages::RETIRE)
    assert_equal :retiring, kids[101].state
    kids.tell_stop(kids[101], Messages::FORCE)
    assert_equal :stopping, kids[101].state
    kids.leaving(100)
    assert_equal :leaving, kids[100].state
    assert kids.started?(kids[100])
    assert_equal :leaving, kids[100].state, "started? changes only a starting worker"
  end

  def test_molds_are_children_with_states_but_not_workers
    kids = children
    worker(kids, 0, 100)
    a, b = pipe
    kids.add_mold(Children::MoldChild.new(300, nil, 0, true, :booting))
    kids.add_mold(Children::MoldChild.new(301, a, 1, false, :serving))
    assert_equal [300, 301], [kids.booting_mold.pid, kids.mold.pid]
    assert_equal [:mold, :worker], [kids.mold.role, kids[100].role]
    assert_equal [100], kids.map(&:pid), "molds are not among the workers"
    assert_equal [100], kids.pids
    kids.close_in_child
    assert a.closed?, "the mold's socket is the master's"
    refute b.closed?
  end
end
