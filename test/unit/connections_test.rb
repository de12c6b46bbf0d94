# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require_relative "../support/worker_rooms"

# The connection state machine (Connections) without sockets or a server: stand-in connections
# whose reads, parses and writes the test scripts, a stand-in Request, runner and poller, and the
# loop as Connections sees it: its Port, nothing else. Each test follows one connection through its
# states (docs/ARCHITECTURE.md's table).
class ConnectionsTest < Minitest::Test
  C = Blackbuck::Connections
  Request = Blackbuck::Request
  Response = Blackbuck::Response
  Conn = Blackbuck::Native::Conn
  IN = Blackbuck::Native::Poller::IN
  OUT = Blackbuck::Native::Poller::OUT
  CONFIG = { keepalive_timeout: 5, header_timeout: 10, body_timeout: 20, write_timeout: 30, max_queue_time: 0 }.freeze

  # A connection as C keeps it; `reads` are what each #fill returns (nil: nothing yet, 0: EOF, else
  # bytes), `next_buffered` what #next_request answers (nil: close, else bytes of the next request).
  class FakeConn
    attr_accessor :fd, :state, :deadline, :watched, :buffered, :requests, :pending_output, :reads,
                  :next_buffered, :flushes, :closed, :shut, :errors, :keepalive_seconds, :filled_at, :unsent

    def initialize(fd)
      @fd = fd
      @state = C::IDLE
      @deadline = 0.0
      @watched = 0
      @buffered = 0
      @requests = 0
      @pending_output = false
      @reads = [1]
      @next_buffered = 0
      @flushes = []
      @closed = false
      @shut = false
      @errors = []
      @unsent = 0 # bytes the kernel still holds for the client (Conn#unsent)
    end

    def fill(woke_at)
      @filled_at = woke_at
      r = @reads.shift
      @buffered += r if r.is_a?(Integer)
      r
    end

    def start_app(_env)
      @state = C::BUSY
      0.0
    end

    def next_request(seconds)
      @keepalive_seconds = seconds
      return nil if @next_buffered.nil?

      @requests += 1
      @state = C::IDLE
      @buffered = @next_buffered
    end

    def polled? = !@watched.zero?

    # Conn#enter, #extend_deadline, #shorten_deadline: C's clock is CLOCK_MONOTONIC.
    def enter(state, seconds)
      @state = state
      extend_deadline(seconds)
    end

    def extend_deadline(seconds) = @deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    def shorten_deadline(deadline) = @deadline = [@deadline, deadline].min
    def closed? = @closed
    def pending_output? = @pending_output
    def close = @closed = true
    def shutdown_write = @shut = true
    def discard_input = true
    def flush = @flushes.shift

    def write_error(status)
      @errors << status
      true
    end
  end

  # Request#advance's stand-in: answers from a script per connection (an env Hash: a request is in).
  class FakeRequest
    attr_reader :discarded

    def initialize = @answers = Hash.new { |h, k| h[k] = [] }
    def script(conn, *answers) = @answers[conn.fd].concat(answers)
    def advance(conn, _body) = @answers[conn.fd].shift || Request::HEAD
    def discard(conn) = (@discarded ||= []) << conn.fd
    def too_slow?(_conn, _t) = false
    def take_spilled = nil
  end

  class FakePoller
    attr_reader :calls

    def initialize = @calls = []

    # Poller#watch and #unwatch keep the Conn's mask and make a system call only for a change.
    def watch(conn, mask)
      return if conn.watched == mask

      @calls << [conn.watched.zero? ? :add : :modify, conn.fd, mask]
      conn.watched = mask
    end

    def unwatch(conn)
      return if conn.watched.zero?

      @calls << [:delete, conn.fd]
      conn.watched = 0
    end
  end

  # The app runner: answers `mode` now (Inline) or nil (Threads: later, through #finished).
  class FakeRunner
    attr_accessor :mode, :done
    attr_reader :ran

    def initialize
      @mode = Response::DONE
      @ran = []
      @done = []
    end

    def run(conn, env, _queued, woke_at)
      @ran << [conn.fd, env]
      @woke_at = woke_at
      @mode
    end

    attr_reader :woke_at

    def finished
      @done.each { |job| yield(*job) }
      @done = []
      false # no thread busy any more
    end
  end

  # The loop behind Connections' Port: what each member was told. (A Struct: a call to anything
  # that is not a member raises.)
  class FakeLoop
    attr_reader :served, :stops, :resumed

    def initialize
      @served = 0
      @stops = []
      @resumed = 0
    end

    # hooks: whether the loop has per-request hooks (after_request; nil without).
    def port(hooks: true)
      C::Port.new(after_request: hooks ? ->(served) { @served = served } : nil,
                  last_request: ->(limit) { @stops << "limit #{limit}" },
                  replace: ->(why) { @stops << "replace: #{why}" },
                  resume_accepting: -> { @resumed += 1 })
    end
  end

  # Balancer's stand-in: a retiring worker moves what becomes idle (#move_idle_later).
  class FakeBalancer
    attr_accessor :retiring
    attr_reader :moved

    def initialize
      @retiring = false
      @moved = []
    end

    def move_idle_later(conn)
      return false unless @retiring

      @moved << conn
      true
    end
  end

  def setup(rewatch: false, requests_limit: 0, hooks: true)
    @loop = FakeLoop.new
    @request = FakeRequest.new
    @runner = FakeRunner.new
    @poller = FakePoller.new
    @balancer = FakeBalancer.new
    @c = C.new(@loop.port(hooks: hooks), CONFIG, @request, nil, 0, rewatch: rewatch, requests_limit: requests_limit)
    @c.start(@poller, @runner, @balancer)
  end

  def env = { "REQUEST_METHOD" => "GET" }

  def test_a_new_connection_whose_request_is_there_is_served_at_once_and_kept_idle
    conn = FakeConn.new(5)
    @request.script(conn, env)
    @c.take(conn, 10, 42.0)
    assert_equal [[5, env]], @runner.ran
    assert_equal 42.0, conn.filled_at # the loop's wake-up time: the start of queue time
    assert_equal 42.0, @runner.woke_at # ... and of the wait in the app threads' queue
    assert_equal 1, @c.served
    assert_equal 1, @loop.served # the loop's per-request hooks were told
    assert_equal C::IDLE, conn.state
    assert_equal 5, conn.keepalive_seconds
    assert_equal [[:add, 5, IN]], @poller.calls # waits for its next request
    assert_same conn, @c[5]
  end

  def test_a_head_in_part_starts_the_head_clock
    conn = FakeConn.new(5)
    @c.take(conn, 10, 42.0)
    assert_equal C::HEAD, conn.state
    assert_in_delta Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10, conn.deadline, 1
    assert_empty @runner.ran
  end

  def test_nothing_read_yet_waits_in_the_poller_with_its_first_deadline
    conn = FakeConn.new(5)
    conn.reads = [nil]
    @c.take(conn, 3, 42.0)
    assert_equal C::IDLE, conn.state
    assert_in_delta Process.clock_gettime(Process::CLOCK_MONOTONIC) + 3, conn.deadline, 1
    assert_equal [[:add, 5, IN]], @poller.calls
  end

  def test_a_body_on_its_way_starts_the_body_clock
    conn = FakeConn.new(5)
    @request.script(conn, Request::BODY)
    @c.take(conn, 10, 42.0)
    assert_equal C::BODY, conn.state
    assert_in_delta Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20, conn.deadline, 1
  end

  def test_a_bad_request_is_answered_and_closed_in_stages
    conn = FakeConn.new(5)
    @request.script(conn, 400)
    @c.take(conn, 10, 42.0)
    assert_equal [400], conn.errors
    assert_equal [5], @request.discarded
    assert conn.shut
    assert_equal C::LINGER, conn.state
    assert_equal [[:add, 5, IN]], @poller.calls # its input read and dropped until the client closes
    @c.on_event(conn, IN, 42.0)
    assert conn.closed # (discard_input: the client closed)
    assert_nil @c[5]
  end

  def test_end_of_input_drops_and_a_paused_worker_may_resume
    conn = FakeConn.new(5)
    conn.reads = [0]
    @c.paused = true
    @c.take(conn, 10, 42.0)
    assert conn.closed
    assert_equal 0, @c.size
    assert_equal 1, @loop.resumed
  end

  def test_a_response_the_client_has_not_taken_waits_then_keep_alive_goes_on
    conn = FakeConn.new(5)
    @request.script(conn, env)
    @runner.mode = Response::WRITTEN
    conn.pending_output = true
    @c.take(conn, 10, 42.0)
    assert_equal C::WRITE, conn.state
    assert_equal [[:add, 5, OUT]], @poller.calls
    conn.flushes = [Conn::WRITE_PENDING, Conn::WRITE_DONE]
    @c.on_event(conn, OUT, 42.0)
    assert_equal C::WRITE, conn.state
    @c.on_event(conn, OUT, 42.0)
    assert_equal C::IDLE, conn.state
    assert_equal [:modify, 5, IN], @poller.calls.last
  end

  def test_a_request_timeout_stops_the_worker_and_closes
    conn = FakeConn.new(5)
    @request.script(conn, env)
    @runner.mode = Response::RETIRE_CLOSE
    @c.take(conn, 10, 42.0)
    assert_equal ["replace: its request timed out or left the process unsafe (logged above)"], @loop.stops
    assert_equal C::LINGER, conn.state
  end

  # The app rescued the timeout and answered (Rails): the answer goes out, and the worker is replaced.
  def test_an_answer_after_a_rescued_timeout_is_sent_and_the_worker_replaced
    conn = FakeConn.new(5)
    @request.script(conn, env)
    @runner.mode = Response::RETIRE_WRITTEN
    @c.take(conn, 10, 42.0)
    assert_equal 1, @loop.stops.size
    assert_equal C::IDLE, conn.state # answered: kept as a finished response is (with "Connection: close" from now on)
  end

  def test_pipelined_requests_are_served_in_turn_then_yield_to_others
    conn = FakeConn.new(5)
    conn.next_buffered = 30 # every answer finds the next request read already
    @request.script(conn, *Array.new(C::PIPELINE_BATCH + 3) { env })
    @c.take(conn, 10, 42.0)
    assert_equal C::PIPELINE_BATCH, @runner.ran.size
    assert_equal [conn], @c.ready
    @c.serve_ready(43.0)
    assert_equal C::PIPELINE_BATCH + 3, @runner.ran.size
    assert_equal 43.0, @runner.woke_at
  end

  def test_the_app_threads_give_the_connection_back_later
    setup(rewatch: true)
    conn = FakeConn.new(5)
    @request.script(conn, env)
    @runner.mode = nil
    @c.take(conn, 10, 42.0)
    assert_equal C::BUSY, conn.state
    assert_equal 0, @c.served
    assert_empty @poller.calls # not watched: the threads have it
    @runner.done = [[conn, 5, Response::DONE]]
    @c.finished(43.0)
    assert_equal 1, @c.served
    assert_equal 1, @loop.served
    assert_equal C::IDLE, conn.state
    assert_equal [[:add, 5, IN]], @poller.calls
  end

  # With app threads a keep-alive connection stays in the poller while its request runs: a request
  # costs no epoll_ctl. Only one that becomes readable meanwhile (a pipelined request, the client
  # closing) leaves it until the app is done.
  def test_app_threads_leave_the_poller_alone_unless_the_connection_stirs
    setup(rewatch: true)
    conn = FakeConn.new(5)
    conn.reads = [nil, 1, 1, 1]
    @request.script(conn, env, env)
    @runner.mode = nil
    @c.take(conn, 10, 42.0) # nothing to read yet: watched
    assert_equal [[:add, 5, IN]], @poller.calls
    @c.on_event(conn, IN, 43.0)
    assert_equal C::BUSY, conn.state
    @runner.done = [[conn, 5, Response::DONE]]
    @c.finished(43.5)
    assert_equal C::IDLE, conn.state
    assert_equal [[:add, 5, IN]], @poller.calls # none while it ran, none after

    @c.on_event(conn, IN, 44.0) # the next request
    assert_equal C::BUSY, conn.state
    @c.on_event(conn, IN, 44.5) # readable while the app runs: out of the poller, not read
    assert_equal [:delete, 5], @poller.calls.last
    assert_equal [1], conn.reads # not read while the app has its request
    @runner.done = [[conn, 5, Response::DONE]]
    @c.finished(45.0)
    assert_equal [:add, 5, IN], @poller.calls.last # watched again once the app is done
  end

  def test_a_hijacked_connection_is_the_apps
    conn = FakeConn.new(5)
    @request.script(conn, env)
    @runner.mode = nil
    @c.take(conn, 10, 42.0)
    @c.hand_over(conn)
    assert_nil @c[5]
    refute conn.closed
  end

  def test_expiry_closes_idle_rejects_half_requests_and_skips_the_apps
    idle, head, busy = [5, 6, 7].map { |fd| FakeConn.new(fd) }
    [idle, head, busy].each do |conn|
      conn.reads = [nil]
      @c.take(conn, 10, 42.0)
    end
    head.state = C::HEAD
    busy.state = C::BUSY
    [idle, head, busy].each { |conn| conn.deadline = 1.0 }
    @c.expire(2.0)
    assert_equal C::LINGER, idle.state
    assert_equal [408], head.errors
    assert_equal C::BUSY, busy.state
  end

  def test_a_stop_shortens_idle_deadlines_and_keep_alive
    conn = FakeConn.new(5)
    conn.reads = [nil]
    @c.take(conn, 10, 42.0)
    @c.stopping!
    assert_operator conn.deadline, :<=, Process.clock_gettime(Process::CLOCK_MONOTONIC) + C::STOP_IDLE_DRAIN
    conn.reads = [1]
    @request.script(conn, env)
    @c.on_event(conn, IN, 42.0)
    assert_equal C::STOP_IDLE_DRAIN, conn.keepalive_seconds
  end

  # Issue 32, item 15: the client of a keep-alive answer still on its way when the stop began reads it
  # after the last byte reached the kernel; the drain counts from when it has taken it all.
  def test_a_stopping_workers_idle_connection_drains_from_when_its_client_has_the_answer
    conn = FakeConn.new(5)
    conn.reads = [nil]
    @c.take(conn, 10, 42.0)
    @c.stopping!
    conn.unsent = 4096
    conn.deadline = 1.0
    @c.expire(2.0)
    assert_equal C::IDLE, conn.state, "kept while the kernel holds part of its answer"
    assert_operator conn.deadline, :>, Process.clock_gettime(Process::CLOCK_MONOTONIC)
    conn.unsent = 0
    conn.deadline = 1.0
    @c.expire(2.0)
    assert_equal C::LINGER, conn.state, "closed once the client had it and the drain passed"
  end

  # ... and a retiring worker moves it to a sibling once its answer is out.
  def test_a_retiring_worker_moves_a_connection_whose_keep_alive_answer_is_out
    @c.stopping!
    @balancer.retiring = true
    conn = FakeConn.new(5)
    @request.script(conn, env)
    @c.take(conn, 10, 42.0)
    assert_equal [conn], @balancer.moved
  end

  def test_max_requests_per_child_begins_the_stop_before_the_last_request_runs
    setup(requests_limit: 2)
    conn = FakeConn.new(5)
    conn.next_buffered = 30
    @request.script(conn, env, env)
    @c.take(conn, 10, 42.0)
    assert_equal ["limit 2"], @loop.stops
    assert_equal 2, @runner.ran.size
  end

  # Without per-request hooks (no oob_gc, no max_memory_per_child: the default) the port has no
  # after_request, and a request costs no call back into the loop: Connections counts it.
  def test_without_hooks_a_request_is_counted_here_and_the_loop_is_not_called
    setup(hooks: false)
    conn = FakeConn.new(5)
    conn.next_buffered = 30
    @request.script(conn, env, env)
    @c.take(conn, 10, 42.0)
    assert_equal 2, @c.served
    assert_equal 0, @loop.served
  end

  # Connections reaches the loop only through its Port: these four callables (a call to anything
  # else on a fake port raises: it is the Port Struct), and the Connections a real Worker builds
  # holds no way to the Worker itself (nor does anything it holds, but the port's callables).
  def test_the_loop_is_reached_only_through_the_port
    assert_equal %i[after_request last_request replace resume_accepting], C::Port.members
    assert_raises(NoMethodError) { @loop.port.counted }
    [[1, true], [2, true], [2, false]].each do |threads, handoff|
      worker, pair = WorkerRooms.build(threads: threads, handoff: handoff)
      conns = WorkerRooms.room(worker, :@connections)
      assert_kind_of C, conns
      refute WorkerRooms.reaches?(conns, worker), "Connections (threads #{threads}) holds a way to its Worker"
    ensure
      pair&.each(&:close)
    end
  end
end
