# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "timeout"
require_relative "../support/worker_rooms"

# The two app runners without a server, with stand-in connections, apps and scoreboard, and the loop
# as a runner sees it (AppRunner::Port, nothing else):
# AppRunner::Inline runs the app on the caller's thread between the gate's request_start and
# request_done; AppRunner::Threads hands requests to its AppPool and gives them back through
# #finished, keeping its busy count and the scoreboard's free threads in step.
class AppRunnerTest < Minitest::Test
  Native = Blackbuck::Native
  Response = Blackbuck::Response
  WAIT = 10 # seconds a test waits for an app thread

  FakeConn = Struct.new(:fd, :watched)

  # The scoreboard (or hand-off watcher) as the runners call it; request_done answers `moved`.
  class FakeGate
    attr_reader :calls
    attr_accessor :moved

    def initialize = @calls = []
    def request_start(index, conn, queued) = @calls << [:start, index, conn, queued]

    def request_done(index, state)
      @calls << [:done, index, state]
      moved
    end

    def free_threads(index, n) = @calls << [:free, index, n]
    def running(index, state, age, method, path) = @calls << [:running, index, state, age && method, path]
    def request_observed(index, queued, ran) = @calls << [:observed, index, queued, ran]
    def frees = @calls.select { |c| c[0] == :free }.map(&:last)
  end

  # The loop behind the runners' Port: what each member was told. (A Struct: a call to anything that
  # is not a member raises.)
  class FakeLoop
    attr_reader :stopped_accepting, :saturations, :timeouts

    def initialize
      @stopped_accepting = 0
      @saturations = 0
      @timeouts = 0
    end

    def port = Blackbuck::AppRunner::Port.new(stop_accepting: -> { @stopped_accepting += 1 },
                                              saturated: -> { @saturations += 1 },
                                              timed_out: -> { @timeouts += 1 })
  end

  LOGGER = Blackbuck::Logger.new(File.open(File::NULL, "w"))
  WOKE = 1.0 # when the loop woke (Connections hands it to #run)

  # The one Request: a spilled body's tempfile the runner closes (Inline) or hands on (Threads).
  class FakeRequest
    attr_accessor :spilled

    def take_spilled
      s = @spilled
      @spilled = nil
      s
    end
  end

  Spill = Struct.new(:closed) do
    def close! = self.closed = true
  end

  # Response#handle's stand-in: calls the app with the env and answers the mode it returns.
  class FakeResponse
    def initialize(_config, app, _logger, _hand_over) = @app = app
    def handle(conn, env) = @app.call(conn, env)
    def timeout_notice(limit) = Blackbuck::RequestTimeout.new("request ran longer than #{limit}s")
  end

  def inline(response_answer)
    @loop = FakeLoop.new
    @gate = FakeGate.new
    @request = FakeRequest.new
    response = Object.new
    response.define_singleton_method(:handle) { |conn, env| response_answer.call(conn, env) }
    response.define_singleton_method(:timeout_notice) { |limit| Blackbuck::RequestTimeout.new("past #{limit}s") }
    Blackbuck::AppRunner::Inline.new(@loop.port, @request, response, @gate, 3)
  end

  def test_inline_runs_the_app_between_request_start_and_request_done
    seen = nil
    runner = inline(->(_c, env) { seen = [runner.in_app?, env]; Response::DONE })
    conn = FakeConn.new(7, 0)
    assert_equal Response::DONE, runner.run(conn, { "x" => 1 }, 0.25, WOKE)
    assert_equal [true, { "x" => 1 }], seen
    refute runner.in_app?
    assert_equal [[:start, 3, conn, 0.25], [:done, 3, Native::Scoreboard::IDLE]], @gate.calls
    assert_nil runner.wake_fd
    assert_equal 0, runner.busy
    refute runner.saturated?
  end

  def test_inline_request_done_runs_even_when_the_app_raises_and_closes_a_spilled_body
    runner = inline(->(_c, _e) { raise IOError, "boom" })
    @request.spilled = spill = Spill.new(false)
    @gate.moved = [11, 12]
    balancer = Struct.new(:released) { def release_moved(fds) = released.concat(fds) }.new([])
    runner.handoff(@gate, balancer) # the hand-off watcher is the gate now
    assert_raises(IOError) { runner.run(FakeConn.new(7, 0), {}, 0.0, WOKE) }
    refute runner.in_app?
    assert spill.closed
    assert_equal [11, 12], balancer.released # the watcher moved these while the app ran
  end

  def test_inline_stopping_reports_stopping_and_a_pending_stop_accepting_is_acted_on
    asked_in_app = nil
    runner = inline(lambda { |_c, _e|
      asked_in_app = runner.stop_accepting_asked
      Response::CLOSE
    })
    runner.stopping!
    refute runner.stop_accepting_asked # the app does not run: remembered for its start
    assert_equal Response::CLOSE, runner.run(FakeConn.new(7, 0), {}, 0.0, WOKE)
    assert_equal 1, @loop.stopped_accepting
    assert asked_in_app # while the app runs the trap acts itself
    runner.run(FakeConn.new(7, 0), {}, 0.0, WOKE)
    assert_equal 1, @loop.stopped_accepting # once
    assert_equal [:done, 3, Native::Scoreboard::STOPPING], @gate.calls.last
  end

  def test_inline_time_out_raises_only_inside_the_app
    runner = inline(->(_c, _e) { runner.time_out(30) })
    runner.time_out(30) # not in the app: nothing
    # in the app: raised there (a Response answers 503 and RETIRE_*; past its rescues, the runner drops the connection)
    assert_equal Response::RETIRE_DROP, runner.run(FakeConn.new(7, 0), {}, 0.0, WOKE)
  end

  # ---- the request timeout with streams: the master's notice (USR2) raised from the worker's trap ----
  # A real Scheduler on this thread (the main one: traps run here) with an Inline runner, hooks as
  # Streams' (the runner's stream_run_begin/end around each run from the loop), the worker's USR2 trap
  # and the notice sent to this process at a chosen point: a signal a process sends itself runs its
  # trap before Process.kill returns, so the point is exact.

  # A Scheduler that sends the notice when a fiber's wait is registered (its own code, on the fiber).
  class NoticeInHook < Blackbuck::Scheduler
    attr_accessor :notice_in_hook

    private

    def add_timer(*)
      Process.kill(:USR2, Process.pid) if notice_in_hook
      super
    end
  end

  # hooks: as Streams' (#before / #after); notice_after: send the notice in #after, before the runner
  # has the loop back (the instant a fiber gives the loop back).
  class StreamHooks
    attr_accessor :runner, :notice_after

    def before(_fiber) = runner.stream_run_begin("GET", "/stream")

    def after(_fiber)
      Process.kill(:USR2, Process.pid) if notice_after
      runner.stream_run_end
    end
  end

  # Yields [scheduler, hooks, counted] with the trap installed; counted[0]: notices the loop is to act
  # on (the trap's count), as Worker's trap counts them.
  def with_stream_loop
    counted = [0]
    runner = inline(->(_c, _e) { Response::DONE })
    hooks = StreamHooks.new
    hooks.runner = runner
    poller = Native::Poller.new(8)
    scheduler = NoticeInHook.new(poller, hooks)
    runner.instance_variable_set(:@streams, Struct.new(:scheduler).new(scheduler)) # (Worker passes streams:)
    runner.start(poller)
    old = trap(:USR2) { counted[0] += 1 if runner.time_out(30) }
    Fiber.set_scheduler(scheduler)
    Timeout.timeout(WAIT) { yield scheduler, hooks, counted }
  ensure
    Fiber.set_scheduler(nil)
    trap(:USR2, old || "DEFAULT")
    poller&.close
  end

  def test_inline_a_notice_as_a_streams_fiber_gives_the_loop_back_is_not_raised_in_the_loop
    with_stream_loop do |s, hooks, counted|
      hooks.notice_after = true
      f = Fiber.new(blocking: false) { sleep 0.001; :ended }
      s.start(f)
      s.run # (the fiber wakes from the loop, ends; the notice comes as it gives the loop back)
      refute f.alive?
      assert_equal 1, counted[0], "not raised in the loop: the loop replaces the worker at its next turn"
      assert_equal 0, @loop.timeouts
    end
  end

  def test_inline_a_notice_in_the_schedulers_own_code_on_the_fiber_is_not_raised_there
    with_stream_loop do |s, _hooks, counted|
      result = nil
      f = Fiber.new(blocking: false) do
        sleep 0.001 # (the first run is the app's request's; from here the loop runs it)
        s.notice_in_hook = true
        sleep 0.001 # (the notice comes while this wait is being registered)
        s.notice_in_hook = false
        result = :woke
      rescue Blackbuck::RequestTimeout
        result = :raised
      end
      s.start(f)
      s.run
      assert_equal :woke, result, "the wait was registered whole and the fiber woke from it"
      assert_equal 1, counted[0]
      assert_equal 0, s.waiting
    end
  end

  def test_inline_a_notice_in_a_streams_run_is_raised_in_its_fiber_and_replaces_the_worker
    with_stream_loop do |s, _hooks, counted|
      result = nil
      f = Fiber.new(blocking: false) do
        sleep 0.001
        Process.kill(:USR2, Process.pid) # (the body spins here: the notice comes in its run)
        result = :not_raised
      rescue Blackbuck::RequestTimeout
        result = :raised
      end
      s.start(f)
      s.run
      assert_equal :raised, result
      assert_equal 1, @loop.timeouts, "the loop is told: the worker is replaced even if the body rescues it"
      assert_equal 0, counted[0]
    end
  end

  def threads(size, app)
    @loop = FakeLoop.new
    @gate = FakeGate.new
    @request = FakeRequest.new
    @poller = Native::Poller.new(8)
    runner = Blackbuck::AppRunner::Threads.new(@loop.port, { threads: size }, app, @request, @gate, 2, LOGGER,
                                               response: FakeResponse)
    runner.start(@poller)
    @runners = (@runners || []) << runner
    runner
  end

  def teardown
    @runners&.each(&:stop)
  end

  # Waits until the wake-up pipe is readable, then collects what #finished yields.
  def finished(runner, count)
    done = []
    Timeout.timeout(WAIT) do
      while done.size < count
        IO.select([IO.for_fd(runner.wake_fd, autoclose: false)])
        runner.finished { |conn, fd, mode| done << [conn, fd, mode] }
      end
    end
    done
  end

  def test_threads_run_the_app_off_the_loop_and_give_the_connection_back
    runner = threads(2, ->(_conn, env) { env[:mode] })
    conn = FakeConn.new(9, 1)
    @request.spilled = spill = Spill.new(false)
    assert_nil runner.run(conn, { mode: Response::WRITTEN }, 0.5, WOKE) # later, through #finished
    assert_equal 1, conn.watched # it stays in the poller as it was (Connections#on_event takes it out if it stirs)
    assert_equal [[conn, 9, Response::WRITTEN]], finished(runner, 1)
    assert spill.closed
    assert_equal 0, runner.busy
    observed = @gate.calls.find { |c| c[0] == :observed }
    assert_equal [2, 0.5], observed[1, 2]
    assert_equal [1], @gate.frees # a thread was free at start, after the push and after it came back
  end

  def test_threads_saturated_when_every_thread_has_a_request
    gate = Queue.new
    runner = threads(2, lambda { |_c, _e|
      gate.pop
      Response::DONE
    })
    runner.run(FakeConn.new(1, 1), {}, 0.0, WOKE)
    refute runner.saturated?
    assert_equal 0, @loop.saturations
    runner.run(FakeConn.new(2, 1), {}, 0.0, WOKE)
    assert runner.saturated?
    assert_equal 1, @loop.saturations # the worker stops taking work
    assert_equal 2, runner.busy
    2.times { gate << :go }
    assert_equal [1, 2], finished(runner, 2).map { |c, _, _| c.fd }.sort
    refute runner.saturated?
    assert_equal [1, 0, 1], @gate.frees # the push that saturated it published none free; the first back one
  end

  def test_threads_take_back_a_queued_request_no_thread_started
    gate = Queue.new
    started = Queue.new
    runner = threads(2, lambda { |_c, _e|
      started << true
      gate.pop
      Response::DONE
    })
    a = FakeConn.new(1, 1)
    b = FakeConn.new(2, 1)
    c = FakeConn.new(3, 1)
    [a, b, c].each { |conn| runner.run(conn, {}, 0.0, WOKE) }
    Timeout.timeout(WAIT) { 2.times { started.pop } } # both threads have theirs
    assert_equal WOKE, runner.oldest_waiting # c waits as of when the loop woke
    offered = []
    runner.take_back do |conn|
      offered << conn
      true
    end
    assert_equal [c], offered # the two running ones are the threads'
    assert_equal 2, runner.busy
    assert_nil runner.oldest_waiting
    2.times { gate << :go }
    assert_equal [1, 2], finished(runner, 2).map { |conn, _, _| conn.fd }.sort
  end

  def test_threads_stopping_publishes_no_free_thread_and_time_out_reaches_the_app
    started = Queue.new
    runner = threads(2, lambda { |_c, _e|
      started << true
      sleep WAIT
      Response::DONE
    })
    runner.stopping!
    assert_equal 0, @gate.frees.last
    runner.run(FakeConn.new(1, 1), {}, 0.0, WOKE)
    started.pop
    assert runner.time_out(0), "a notice was sent: the worker retires at once"
    _, _, mode = finished(runner, 1).first
    assert_equal Response::RETIRE_DROP, mode
    runner.tick
    assert_equal [:running, 2, Native::Scoreboard::STOPPING, nil, nil], @gate.calls.last
  end

  # A runner reaches the loop only through the Port: stop_accepting and timed_out (Inline), saturated (Threads)
  # (a call to anything else on a fake port raises: it is the Port Struct), and the runner a real
  # Worker builds holds no way to the Worker itself (nor does anything it holds, but the port's
  # callables).
  def test_the_loop_is_reached_only_through_the_port
    assert_equal %i[stop_accepting saturated timed_out], Blackbuck::AppRunner::Port.members
    assert_raises(NoMethodError) { FakeLoop.new.port.woke_at }
    { 1 => Blackbuck::AppRunner::Inline, 2 => Blackbuck::AppRunner::Threads }.each do |threads, kind|
      worker, pair = WorkerRooms.build(threads: threads)
      runner = WorkerRooms.room(worker, :@runner)
      assert_kind_of kind, runner
      refute WorkerRooms.reaches?(runner, worker), "#{kind} holds a way to its Worker"
    ensure
      pair&.each(&:close)
    end
  end
end
