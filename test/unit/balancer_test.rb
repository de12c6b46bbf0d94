# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"
require "tmpdir"
require_relative "../support/worker_rooms"

# Balancer's policy without a server, with a stand-in runner and connections and the loop as the
# Balancer sees it (its Port, nothing else): the one "room for one more?" answer in each mode, when
# a request on an idle connection or a new one moves on, and when a request queued for a thread
# moves to another worker.
class BalancerTest < Minitest::Test
  Native = Blackbuck::Native
  AFTER = 0.002 # handoff_after, seconds
  MAX = 10      # max_connections
  WOKE = 100.0  # when the loop woke (the loop hands it to every call that needs it)

  # What the balancer asks of the worker's Connections.
  class FakeConnections
    attr_accessor :connection_count
    attr_reader :dropped, :unwatched, :taken

    def initialize
      @connection_count = 0
      @dropped = []
      @unwatched = []
      @taken = []
    end

    def drop(conn) = @dropped << conn
    def unwatch(conn) = @unwatched << conn

    def moved_away(conn)
      unwatch(conn)
      drop(conn)
    end
    def take(conn, seconds, woke_at, moved) = @taken << [conn, seconds, woke_at, moved]
    def table = self # (its size)
    def size = @connection_count
    def [](_fd) = nil
    def values = [] # (no connection: #move_idle moves none)
  end

  # The loop behind Balancer's Port: how often it was told to pause accepting. (A Struct: a call to
  # anything that is not a member raises.)
  class FakeLoop
    attr_reader :paused

    def initialize = @paused = 0
    def port = Blackbuck::Balancer::Port.new(pause_accepting: -> { @paused += 1 })
  end

  # AppRunner's side: busy, size, the pool's own room and queue.
  class FakeRunner
    attr_accessor :busy, :pool_room, :oldest_waiting, :typical, :queued
    attr_reader :size, :handed, :room_asked_at

    def initialize(size)
      @size = size
      @busy = 0
      @pool_room = true
      @typical = 0.0
      @queued = []
    end

    def saturated? = @busy >= @size
    def room?(now)
      @room_asked_at = now
      @pool_room
    end
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
    @conns = FakeConnections.new
    @loop = FakeLoop.new
    @runner = FakeRunner.new(threads)
    @scoreboard = FakeScoreboard.new
    @poller = Native::Poller.new(8)
    @pair = Socket.pair(:UNIX, :SEQPACKET) if handoff
    config = { handoff_after: after, header_timeout: 7, max_connections: MAX }
    logger = Blackbuck::Logger.new(File.open(File::NULL, "w"))
    b = Blackbuck::Balancer.new(@loop.port, @conns, @runner, config, @scoreboard, logger, 0, @pair)
    b.start(@poller, [[{}, false]]) unless threads == 1 && handoff # (one thread: a watcher, tested in handoff_test.rb)
    b
  end

  def teardown
    @pair&.each(&:close)
  end

  def test_without_hand_off_room_is_the_connection_limit_and_nothing_moves
    b = balancer(threads: 1, handoff: false)
    assert_nil b.fd
    assert b.room?(WOKE)
    assert b.accept?
    @conns.connection_count = MAX
    refute b.room?(WOKE)
    refute b.accept?
    refute b.pass_new(FakeConn.new(true), WOKE)
    refute b.take_left_over(WOKE)
  end

  def test_threads_without_hand_off_take_nothing_while_every_thread_is_busy
    b = balancer(threads: 2, handoff: false)
    @runner.busy = 1
    assert b.room?(WOKE)
    @runner.busy = 2
    refute b.room?(WOKE)
    refute b.accept? # new connections wait in the listen queue
    refute b.pass_on(FakeConn.new(true), false, WOKE)
  end

  def test_saturated_without_hand_off_stops_accepting_and_with_it_stops_taking_moved_ones
    assert balancer(threads: 2, handoff: false).saturated # the loop stops accepting: new connections wait in the listen queue
    b = balancer(threads: 2)
    refute b.saturated # still accepting: a request on a new one moves on at once
    @pair[0].write("x")
    assert_equal 0, @poller.wait(10, []) # the hand-off socket is out of the poller
  end

  def test_threads_with_hand_off_queue_one_round_behind_busy_threads
    b = balancer(threads: 3)
    refute_nil b.fd
    @runner.busy = 3
    assert b.room?(WOKE) # saturated, and the queue has room
    @runner.busy = 5
    assert b.room?(WOKE)
    @runner.busy = 6 # threads + a round (3)
    refute b.room?(WOKE)
    assert b.accept? # a new connection's request moves on at once instead
    @conns.connection_count = MAX
    refute b.accept?
  end

  def test_threads_held_by_slow_requests_leave_no_room
    b = balancer(threads: 3)
    @runner.busy = 3
    @runner.pool_room = false # AppPool#room?: the threads run requests older than a typical one
    refute b.room?(WOKE)
    assert_equal WOKE, @runner.room_asked_at # as of when the loop woke
    @runner.busy = 2
    assert b.room?(WOKE) # a free thread
  end

  def test_queue_min_is_a_round_of_at_least_two
    b = balancer(threads: 1 + 1)
    @runner.busy = 3
    assert b.room?(WOKE)
    @runner.busy = 2 + Blackbuck::Balancer::QUEUE_MIN
    refute b.room?(WOKE)
  end

  def test_a_request_on_an_idle_connection_moves_on_only_when_there_is_no_room
    b = balancer(threads: 2)
    @runner.busy = 2
    conn = FakeConn.new(true)
    refute b.pass_on(conn, false, WOKE) # room in the queue: it waits here
    assert_nil conn.passed
    @runner.busy = 4
    assert b.pass_on(conn, false, WOKE)
    assert_equal @pair[0].fileno, conn.passed
    assert_equal [conn], @conns.unwatched
    assert_equal [conn], @conns.dropped
    assert_equal 1, b.moved_out
    stuck = FakeConn.new(false) # part of it read already, or the hand-off queue is full
    refute b.pass_on(stuck, false, WOKE)
    assert_equal [conn], @conns.dropped
    b.tick(false)
    assert_equal [0, 1, 0], @scoreboard.reported
  end

  def test_a_new_connection_moves_on_when_there_is_no_room
    b = balancer(threads: 2)
    @runner.busy = 3
    refute b.pass_new(FakeConn.new(true), WOKE)
    @runner.busy = 4
    assert b.pass_new(FakeConn.new(true), WOKE)
  end

  def test_a_queued_request_moves_once_it_waited_handoff_after_and_a_thread_is_free_elsewhere
    b = balancer(threads: 2)
    queued = FakeConn.new(true)
    @runner.queued = [queued]
    @runner.busy = 3
    @runner.oldest_waiting = WOKE - AFTER / 2
    b.move_waiting(WOKE)
    assert_empty @conns.dropped # not yet: it waited less than handoff_after
    assert_equal WOKE + AFTER, b.next_look(WOKE + 1, WOKE) # look again then
    @runner.typical = 1.0
    @runner.oldest_waiting = WOKE - AFTER * 1.5
    b.move_waiting(WOKE)
    assert_empty @conns.dropped # no free thread elsewhere, and not twice a typical run
    @scoreboard.free_elsewhere = true
    b.move_waiting(WOKE)
    assert_equal [queued], @conns.dropped
    assert_equal 2, @runner.busy
    assert_equal 1, b.moved_out
  end

  def test_a_queued_request_moves_anyway_once_it_waited_twice_a_typical_run
    b = balancer(threads: 2)
    queued = FakeConn.new(true)
    @runner.queued = [queued]
    @runner.busy = 3
    @runner.typical = 0.01
    @runner.oldest_waiting = WOKE - AFTER - 0.019
    b.move_waiting(WOKE)
    assert_empty @conns.dropped
    @runner.oldest_waiting = WOKE - AFTER - 0.021
    b.move_waiting(WOKE)
    assert_equal [queued], @conns.dropped
  end

  def test_nothing_is_queued_here_while_a_thread_is_free
    b = balancer(threads: 2)
    @runner.busy = 2
    @runner.oldest_waiting = 0.0
    assert_equal 5.0, b.next_look(5.0, WOKE)
    b.move_waiting(WOKE)
    assert_empty @conns.dropped
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
    @runner.oldest_waiting = WOKE # just now
    assert_equal 2, b.move_queued
    assert_equal queued, @conns.dropped
    assert_equal 2, b.moved_out
  end

  def test_nothing_waiting_on_the_hand_off_socket_adopts_nothing
    b = balancer(threads: 2)
    assert b.adopt_one(WOKE), "woken with nothing there: a wake-up passed on, the loop is to look at its listeners"
    b.adopt_while_room(WOKE)
    refute b.take_left_over(WOKE)
    assert_empty @conns.taken
    @runner.busy = 4 # no room: nothing taken, and nothing for the listeners either
    refute b.adopt_one(WOKE)
  end

  # A connection a sibling moved is taken as of when the loop woke (its request arrived by then),
  # and the loop is not sent to its listeners.
  def test_a_moved_connection_is_taken_as_of_when_the_loop_woke
    b = balancer(threads: 2)
    Dir.mktmpdir("bb-balancer") do |dir|
      server = UNIXServer.new("#{dir}/s")
      client = UNIXSocket.new("#{dir}/s")
      sent = Native::Conn.accept(server.fileno, {}, false, false, 0)
      sent.enter(Native::Conn::IDLE, 30)
      assert sent.pass_idle(@pair[0].fileno) # a sibling's idle connection, moved (Balancer#move_idle)
      refute b.adopt_one(WOKE)
      conn, seconds, woke_at, moved = @conns.taken.first
      assert_equal [7, WOKE, true], [seconds, woke_at, moved] # header_timeout: it served no request yet
      conn.close
    ensure
      client&.close
      server&.close
    end
  end

  # Balancer reaches the loop only through its Port: pause_accepting (a call to anything else on a
  # fake port raises: it is the Port Struct), and the Balancer a real Worker builds (with either way
  # of moving requests) holds no way to the Worker itself (nor does anything it holds, but the
  # port's callables).
  def test_the_loop_is_reached_only_through_the_port
    assert_equal %i[pause_accepting], Blackbuck::Balancer::Port.members
    assert_raises(NoMethodError) { FakeLoop.new.port.accept_stranded }
    [[1, true], [2, true], [2, false]].each do |threads, handoff|
      worker, pair = WorkerRooms.build(threads: threads, handoff: handoff)
      balancer = WorkerRooms.room(worker, :@balancer)
      assert_kind_of Blackbuck::Balancer, balancer
      refute WorkerRooms.reaches?(balancer, worker), "Balancer (threads #{threads}) holds a way to its Worker"
    ensure
      pair&.each(&:close)
    end
  end
end
