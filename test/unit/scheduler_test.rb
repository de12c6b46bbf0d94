# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "timeout"

# The worker's fiber scheduler without a server: a Native::Poller of its own, the fibers started on a
# thread of the test's (Fiber.set_scheduler is per thread), and Scheduler#run as the loop. Each test
# waits for states (a fiber is waiting, a value came), never for time.
class SchedulerTest < Minitest::Test
  Scheduler = Blackbuck::Scheduler
  LIMIT = 10 # seconds a test may take at most (a hang fails it instead of the suite)

  # Runs block(scheduler) on a thread of its own with the scheduler set there; returns the block's value.
  def on_loop(hooks = nil)
    Timeout.timeout(LIMIT) do
      Thread.new do
        poller = Blackbuck::Native::Poller.new(16)
        scheduler = Scheduler.new(poller, hooks)
        Fiber.set_scheduler(scheduler)
        begin
          yield scheduler
        ensure
          Fiber.set_scheduler(nil)
          poller.close
        end
      end.value
    end
  end

  def fiber(&block) = Fiber.new(blocking: false, &block)

  def test_sleeping_fibers_wake_in_the_order_of_their_deadlines
    order = on_loop do |s|
      woke = []
      s.start(fiber { sleep 0.2; woke << :long })
      s.start(fiber { sleep 0.01; woke << :short })
      assert_equal 2, s.waiting, "both fibers wait in sleep: the loop's fiber runs on"
      refute_empty s.timers
      s.run
      woke
    end
    assert_equal %i[short long], order
  end

  def test_next_deadline_is_the_first_timer_and_bounds_the_loops_wait
    on_loop do |s|
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      s.start(fiber { sleep 5 })
      s.start(fiber { sleep 0.5 })
      deadline = s.next_deadline(t0 + 60)
      assert_in_delta t0 + 0.5, deadline, 0.2
      assert_equal t0 + 0.1, s.next_deadline(t0 + 0.1), "an earlier bound stands"
      s.stop(Blackbuck::StreamStop) # (end them: the test must not wait 5 s)
      s.run_timers(Float::INFINITY)
    end
  end

  def test_unblock_from_another_thread_resumes_a_fiber_waiting_on_a_queue
    got = on_loop do |s|
      queue = Thread::Queue.new
      value = nil
      f = fiber { value = queue.pop }
      s.start(f)
      assert s.waiting?(f), "Queue#pop suspended the fiber (block), not the thread"
      pusher = Thread.new { queue.push(:event) } # unblock from a thread with no scheduler
      s.run
      pusher.join
      value
    end
    assert_equal :event, got
  end

  def test_block_with_a_timeout_answers_false_when_nothing_came
    got = on_loop do |s|
      mutex = Thread::Mutex.new
      cv = Thread::ConditionVariable.new
      result = nil
      s.start(fiber { mutex.synchronize { result = cv.wait(mutex, 0.01) } })
      s.run
      result
    end
    refute_nil got # (ConditionVariable#wait answers self, or the mutex, once it timed out)
  end

  def test_io_wait_suspends_until_the_descriptor_is_readable
    got = on_loop do |s|
      r, w = IO.pipe
      data = nil
      f = fiber { data = r.read(5) }
      s.start(f)
      assert s.waiting?(f), "the read would block: the fiber waits on the poller"
      w.write("hello")
      s.run
      [r, w].each(&:close)
      data
    end
    assert_equal "hello", got
  end

  def test_io_wait_timeout_answers_false
    got = on_loop do |s|
      r, w = IO.pipe
      ready = :unset
      s.start(fiber { ready = r.wait_readable(0.01) })
      s.run
      [r, w].each(&:close)
      ready
    end
    assert_nil got
  end

  # A body that closes a descriptor another of its fibers waits on: the waiter is resumed with the
  # IOError a thread blocked on it gets, and the closer goes on. Ruby 4.0 tells the scheduler
  # (fiber_interrupt, then io_close, before close(2): the poller forgets the number while it is still
  # this file's); Ruby 3.4 tells it nothing, and the loop finds the closed descriptor itself
  # (Scheduler#reap_closed, every turn of #run, every tick of the worker).
  def test_closing_a_descriptor_a_fiber_waits_on_resumes_that_fiber_with_ioerror
    # (Ruby 3.1's IO#close waits on the thread, asking no scheduler, until the waiting fiber lets go:
    # a fiber of the same thread never runs again, so the close never returns. Nothing a scheduler can
    # change; a version, as no hook or method tells it apart.)
    skip "Ruby #{RUBY_VERSION}: IO#close in a fiber waits the thread for the fiber waiting on it" if RUBY_VERSION < "3.4"
    got = on_loop do |s|
      r, w = IO.pipe
      error = closed = nil
      waiter = fiber do
        r.read(5)
      rescue IOError => e
        error = e
      end
      s.guard_loop do # (as the worker's loop runs: Worker#run)
        s.start(waiter)
        assert s.waiting?(waiter)
        s.start(fiber { r.close; closed = :closed })
        s.run
      end
      refute waiter.alive?
      w.close
      [error, closed, s.waiting]
    end
    assert_kind_of IOError, got[0]
    assert_equal :closed, got[1], "the closer went on"
    assert_equal 0, got[2]
  end

  # ... and from another thread (an ActionController::Live action's, say): the waiter is resumed from
  # the loop (fiber_interrupt only queues it and wakes the loop). Ruby 3.4 raises the closer's IOError
  # in whatever the loop's thread runs: the loop runs inside Scheduler#guard_loop, where it is not.
  def test_a_descriptor_closed_by_another_thread_resumes_the_fiber_waiting_on_it
    got = on_loop do |s|
      r, w = IO.pipe
      error = nil
      waiter = fiber do
        r.read(5)
      rescue IOError => e
        error = e
      end
      s.start(waiter)
      closer = Thread.new { r.close }
      s.run
      closer.join
      w.close
      error
    end
    assert_kind_of IOError, got
  end

  def test_timeout_raises_where_the_fiber_waits
    got = on_loop do |s|
      error = nil
      s.start(fiber do
        Timeout.timeout(0.01) { sleep 5 }
      rescue Timeout::Error => e
        error = e
      end)
      s.run
      error
    end
    assert_kind_of Timeout::Error, got
  end

  def test_resume_raises_an_exception_where_the_fiber_waits
    got = on_loop do |s|
      seen = nil
      f = fiber do
        sleep 60
      rescue Blackbuck::StreamStop => e
        seen = e
      end
      s.start(f)
      assert s.resume(f, Blackbuck::StreamStop.new("stop")), "the fiber was waiting"
      refute f.alive?
      refute s.resume(f, nil), "a finished fiber waits for nothing"
      seen
    end
    assert_kind_of Blackbuck::StreamStop, got
  end

  def test_after_stop_every_wait_raises_at_once
    got = on_loop do |s|
      s.stop(Blackbuck::StreamStop)
      outcome = nil
      s.start(fiber do
        sleep 60
      rescue Blackbuck::StreamStop
        outcome = :stopped
      end)
      outcome
    end
    assert_equal :stopped, got
  end

  def test_hooks_run_around_each_resume_from_the_loop
    hooks = Class.new do
      attr_reader :calls

      def initialize = @calls = []
      def before(fiber) = @calls << [:before, fiber.alive?]
      def after(fiber) = @calls << [:after, fiber.alive?]
    end.new
    on_loop(hooks) do |s|
      s.start(fiber { sleep 0.01 })
      assert_empty hooks.calls, "the first run is the caller's (inside the app's request)"
      s.run
    end
    assert_equal [[:before, true], [:after, false]], hooks.calls
  end

  # Outside the scheduler's own fibers (app.call runs on the loop's blocking fiber; an Enumerator's
  # fiber inside it is non-blocking): a hook waits the thread, as without a scheduler.
  def test_a_wait_outside_its_fibers_blocks_the_thread_instead
    got = on_loop do |s|
      queue = Thread::Queue.new
      Thread.new { queue.push(:late) }
      inner = Fiber.new(blocking: false) { [sleep(0.001), queue.pop] }
      value = inner.resume
      assert_equal 0, s.waiting
      value.last
    end
    assert_equal :late, got
  end

  def test_timeout_outside_its_fibers_still_raises
    got = on_loop do |s|
      inner = Fiber.new(blocking: false) do
        Timeout.timeout(0.01) { IO.pipe[0].read(1) } # (read blocks the thread: not one of ours)
      rescue Timeout::Error => e
        e
      end
      value = inner.resume
      assert_equal 0, s.waiting
      value
    end
    assert_kind_of Timeout::Error, got
  end
end
