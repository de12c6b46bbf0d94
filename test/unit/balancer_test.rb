# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"

# Balancer's policy without a server, with a stand-in worker, runner and connections: the one
# "room for one more?" answer in each mode, when a request on an idle connection or a new one
# moves on, and when a request queued for a thread moves to another worker.
class BalancerTest < Minitest::Test
  Native = Blackbuck::Native
  AFTER = 0.002 # handoff_after, seconds
  MAX = 10      # max_connections

  # What the balancer asks of its worker and of its Connections.
  class FakeWorker
    attr_accessor :connection_count, :woke_at
    attr_reader :dropped, :unwatched, :paused, :taken, :stranded_looks

    def initialize
      @connection_count = 0
      @woke_at = 100.0
      @dropped = []
      @unwatched = []
      @taken = []
      @paused = 0
      @stranded_looks = 0
    end

    def drop(conn) = @dropped << conn
    def unwatch(conn) = @unwatched << conn

    def moved_away(conn)
      unwatch(conn)
      drop(conn)
    end
    def pause_accepting = @paused += 1
    def paused? = @paused.positive?
    def accept_stranded = @stranded_looks += 1
    def take(conn, seconds, woke_at, moved) = @taken << [conn, seconds, woke_at, moved]
    def table = self # (its size)
    def size = @connection_count
    def [](_fd) = nil
    def values = [] # (no connection: #move_idle moves none)
  end

  # AppRunner's side: busy, size, the pool's own room and queue.
  class FakeRunner
    attr_accessor :busy, :pool_room, :oldest_waiting, :typical, :queued
    attr_reader :size, :handed

    def initialize(size)
      @size = size
      @busy = 0
      @pool_room = true
      @typical = 0.0
      @queued = []
    end

    def saturated? = @busy >= @size
    def room?(_now) = @pool_room
    def handoff(watcher, balancer) = @handed = [watcher, balancer]

    def take_back
      @queued.reject! do |conn|
        next false unless yield conn

        @busy -= 1
        true
      end
    end
  end

  class FakeScoreboard
    attr_accessor :free_elsewhere
    attr_reader :reported

    def free_elsewhere?(_index) = @free_elsewhere
    def moves(index, out, inn) = (@reported = [index, out, inn])
  end

  # A connection that moves (Conn#pass, #pass_request) when `passes`.
  FakeConn = Struct.new(:passes, :passed) do
    def pass(fd) = passes && (self.passed = fd)
    def pass_request(fd) = passes && (self.passed = fd)
  end

  def balancer(threads:, handoff: true, after: AFTER)
    Native.configure(Blackbuck::Config.new.values) # Conn.receive needs the settings: C has none until then
    @worker = FakeWorker.new
    @runner = FakeRunner.new(threads)
    @scoreboard = FakeScoreboard.new
    @poller = Native::Poller.new(8)
    @pair = Socket.pair(:UNIX, :SEQPACKET) if handoff
    config = { handoff_after: after, header_timeout: 7, max_connections: MAX }
    logger = Blackbuck::Logger.new(File.open(File::NULL, "w"))
    b = Blackbuck::Balancer.new(@worker, @worker, @runner, config, @scoreboard, logger, 0, @pair)
    b.start(@poller, [[{}, false]]) unless threads == 1 && handoff # (one thread: a watcher, tested in handoff_test.rb)
    b
  end

  def teardown
    @pair&.each(&:close)
  end

  def test_without_hand_off_room_is_the_connection_limit_and_nothing_moves
    b = balancer(threads: 1, handoff: false)
    assert_nil b.fd
    assert b.room?
    assert b.accept?
    @worker.connection_count = MAX
    refute b.room?
    refute b.accept?
    refute b.pass_new(FakeConn.new(true))
    refute b.take_left_over
  end

  def test_threads_without_hand_off_take_nothing_while_every_thread_is_busy
    b = balancer(threads: 2, handoff: false)
    @runner.busy = 1
    assert b.room?
    @runner.busy = 2
    refute b.room?
    refute b.accept? # new connections wait in the listen queue
    refute b.pass_on(FakeConn.new(true), false)
  end

  def test_saturated_without_hand_off_stops_accepting_and_with_it_stops_taking_moved_ones
    balancer(threads: 2, handoff: false).saturated
    assert_equal 1, @worker.paused # new connections wait in the listen queue
    b = balancer(threads: 2)
    b.saturated
    assert_equal 0, @worker.paused # still accepting: a request on a new one moves on at once
    @pair[0].write("x")
    assert_equal 0, @poller.wait(10, []) # the hand-off socket is out of the poller
  end

  def test_threads_with_hand_off_queue_one_round_behind_busy_threads
    b = balancer(threads: 3)
    refute_nil b.fd
    @runner.busy = 3
    assert b.room? # saturated, and the queue has room
    @runner.busy = 5
    assert b.room?
    @runner.busy = 6 # threads + a round (3)
    refute b.room?
    assert b.accept? # a new connection's request moves on at once instead
    @worker.connection_count = MAX
    refute b.accept?
  end

  def test_threads_held_by_slow_requests_leave_no_room
    b = balancer(threads: 3)
    @runner.busy = 3
    @runner.pool_room = false # AppPool#room?: the threads run requests older than a typical one
    refute b.room?
    @runner.busy = 2
    assert b.room? # a free thread
  end

  def test_queue_min_is_a_round_of_at_least_two
    b = balancer(threads: 1 + 1)
    @runner.busy = 3
    assert b.room?
    @runner.busy = 2 + Blackbuck::Balancer::QUEUE_MIN
    refute b.room?
  end

  def test_a_request_on_an_idle_connection_moves_on_only_when_there_is_no_room
    b = balancer(threads: 2)
    @runner.busy = 2
    conn = FakeConn.new(true)
    refute b.pass_on(conn, false) # room in the queue: it waits here
    assert_nil conn.passed
    @runner.busy = 4
    assert b.pass_on(conn, false)
    assert_equal @pair[0].fileno, conn.passed
    assert_equal [conn], @worker.unwatched
    assert_equal [conn], @worker.dropped
    assert_equal 1, b.moved_out
    stuck = FakeConn.new(false) # part of it read already, or the hand-off queue is full
    refute b.pass_on(stuck, false)
    assert_equal [conn], @worker.dropped
    b.tick
    assert_equal [0, 1, 0], @scoreboard.reported
  end

  def test_a_new_connection_moves_on_when_there_is_no_room
    b = balancer(threads: 2)
    @runner.busy = 3
    refute b.pass_new(FakeConn.new(true))
    @runner.busy = 4
    assert b.pass_new(FakeConn.new(true))
  end

  def test_a_queued_request_moves_once_it_waited_handoff_after_and_a_thread_is_free_elsewhere
    b = balancer(threads: 2)
    queued = FakeConn.new(true)
    @runner.queued = [queued]
    @runner.busy = 3
    @runner.oldest_waiting = @worker.woke_at - AFTER / 2
    b.move_waiting
    assert_empty @worker.dropped # not yet: it waited less than handoff_after
    assert_equal @worker.woke_at + AFTER, b.next_look(@worker.woke_at + 1) # look again then
    @runner.typical = 1.0
    @runner.oldest_waiting = @worker.woke_at - AFTER * 1.5
    b.move_waiting
    assert_empty @worker.dropped # no free thread elsewhere, and not twice a typical run
    @scoreboard.free_elsewhere = true
    b.move_waiting
    assert_equal [queued], @worker.dropped
    assert_equal 2, @runner.busy
    assert_equal 1, b.moved_out
  end

  def test_a_queued_request_moves_anyway_once_it_waited_twice_a_typical_run
    b = balancer(threads: 2)
    queued = FakeConn.new(true)
    @runner.queued = [queued]
    @runner.busy = 3
    @runner.typical = 0.01
    @runner.oldest_waiting = @worker.woke_at - AFTER - 0.019
    b.move_waiting
    assert_empty @worker.dropped
    @runner.oldest_waiting = @worker.woke_at - AFTER - 0.021
    b.move_waiting
    assert_equal [queued], @worker.dropped
  end

  def test_nothing_is_queued_here_while_a_thread_is_free
    b = balancer(threads: 2)
    @runner.busy = 2
    @runner.oldest_waiting = 0.0
    assert_equal 5.0, b.next_look(5.0)
    b.move_waiting
    assert_empty @worker.dropped
  end

  def test_intake_follows_the_poller_once_per_change
    b = balancer(threads: 2)
    b.intake(true) # already polled since #start: no second add
    b.intake(false)
    b.intake(false)
    b.intake(true)
    events = []
    @pair[0].write("x")
    assert_equal 1, @poller.wait(100, events)
    assert_equal @pair[1].fileno, events[0]
  end

  # A retiring worker's idle connections are its siblings' once moved: a thread freed afterwards
  # (Worker#finished asks for intake again) does not put the hand-off socket back in its poller.
  def test_a_retiring_worker_never_watches_the_hand_off_socket_again
    b = balancer(threads: 2)
    assert_equal 0, b.move_idle
    b.intake(true)
    @pair[0].write("x")
    assert_equal 0, @poller.wait(0, [])
  end

  # A thread stuck past the timeout: every queued request moves on at once, however briefly it waited.
  def test_move_queued_moves_every_queued_request_at_once
    b = balancer(threads: 2)
    queued = [FakeConn.new(true), FakeConn.new(true)]
    @runner.queued = queued.dup
    @runner.busy = 4
    @runner.oldest_waiting = @worker.woke_at # just now
    assert_equal 2, b.move_queued
    assert_equal queued, @worker.dropped
    assert_equal 2, b.moved_out
  end

  def test_nothing_waiting_on_the_hand_off_socket_adopts_nothing
    b = balancer(threads: 2)
    refute b.adopt_one
    b.adopt_while_room
    refute b.take_left_over
    assert_empty @worker.taken
    assert_equal 1, @worker.stranded_looks, "woken with nothing there: a wake-up passed on, the listeners looked at"
  end
end
