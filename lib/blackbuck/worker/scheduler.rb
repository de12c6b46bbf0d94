# frozen_string_literal: true

module Blackbuck
  # The worker's fiber scheduler (Ruby's Fiber::Scheduler interface), built on the worker's own loop
  # rather than a second one (docs/ARCHITECTURE.md, "Long streams"). It runs nothing by itself: the
  # loop hands it what it saw and it resumes the fibers that were waiting for that.
  #
  #   a descriptor    io_wait registers it in the worker's poller (Native::Poller); the loop hands
  #                   its events to #io_ready
  #   time            kernel_sleep and the timeouts of block, io_wait and timeout_after are in a timer
  #                   heap (#timers); its first deadline bounds the loop's wait (#next_deadline), and
  #                   the loop fires what is due (#run_timers)
  #   another fiber   unblock (Queue#pop, Mutex, ConditionVariable, Thread#join): may be called from
  #   or thread       any thread, so it only pushes onto a locked ready list (a Thread::Queue) and
  #                   writes a byte to the wake-up pipe (#wake_fd), which the loop polls (#on_wake)
  #
  # Hooks not defined here (io_read, io_write, address_resolve, process_wait,
  # blocking_operation_wait) are done blocking by Ruby, as without a scheduler.
  #
  # Only fibers started here (#start, from the loop's fiber) wait through it: a hook called anywhere
  # else (an Enumerator's fiber inside app.call, which runs on the loop's blocking fiber) waits the
  # thread as Ruby would without a scheduler, so the app's call never switches fibers. Fibers are
  # switched with Fiber#transfer: a hook transfers to the loop's fiber, which transfers back with the
  # value the hook returns (an Exception is raised where the fiber waits: #resume).
  #
  # hooks: an object with before(fiber) and after(fiber), called around every run of a fiber the
  # loop resumes (Streams: the request clock, the end of a stream), and, if it has one,
  # suspending(fiber), called on the fiber as it is about to wait (Streams: a stream's head goes out
  # at its first wait), as this scheduler's own code; or nil.
  #
  # The master's request-timeout notice (USR2) is raised from a trap, wherever the loop's thread is
  # then. It belongs in the app's code only: #interruptible? says whether it may be raised now. Not in
  # this scheduler's own code (a hook's bookkeeping before it suspends, the switch to a fiber and
  # back: #own), and never on the loop's fiber while a fiber of ours is being run, which is where a
  # fiber that ended or waits gives the loop back. (Thread.handle_interrupt cannot do this: a trap's
  # raise is not an interrupt it defers, and its masks are the thread's, not a fiber's, so a mask
  # around a switch would be popped by whichever fiber leaves its block first.)
  class Scheduler
    # What a suspended fiber waits for: an fd and its events (io_wait), a blocker (block), a timer.
    Wait = Struct.new(:fiber, :blocker, :fd, :events, :timer, :io)
    # What a fiber waiting on a descriptor gets when the descriptor is closed meanwhile (#io_close,
    # #fiber_interrupt): what a thread blocked on it gets in Ruby.
    STREAM_CLOSED = "stream closed in another thread"
    # A timer: due `at` (monotonic seconds); `seq` orders equal deadlines. wait: the wait it ends
    # (nil once cancelled, or for timeout_after: any wait of `fiber`); value: what the fiber gets.
    Timer = Struct.new(:at, :seq, :fiber, :wait, :value, :any)

    IN = Native::Poller::IN
    OUT = Native::Poller::OUT
    ERR = Native::Poller::ERR

    # Fibers waiting now; the timer heap (the loop asks `empty?` of it each turn: no call to this object).
    attr_reader :timers

    def initialize(poller, hooks = nil)
      @poller = poller
      @hooks = hooks
      @suspending = hooks.respond_to?(:suspending) # (hooks.suspending before each wait)
      @loop = Fiber.current # the fiber that resumes the others (the worker's loop; a test's own)
      @timers = []
      @seq = 0
      @waits = {}  # fiber => Wait: every fiber suspended here
      @io = {}     # fd => [Wait, ...] waiting on it; registered in the poller with their events' union
      @ready = Thread::Queue.new # [blocker, fiber] unblocked, from any thread (its own lock)
      @signaled = false # a byte is in the pipe that the loop has not read yet
      @wake_r, @wake_w = IO.pipe
      @poller.add(@wake_r.fileno, IN)
      @current = nil  # the fiber this loop is running now (hooks suspend only inside one of ours)
      @stopping = nil # an exception every later wait raises at once (#stop)
      @fallback = nil # [fiber, reader, writer] waiting the thread outside our fibers (block)
      @own = false    # this scheduler's (or Streams') own code runs: no timeout notice now (#interruptible?)
      @thread = Thread.current # the loop's (unblock and fiber_interrupt may come from others)
    end

    def wake_fd = @wake_r.fileno
    def waiting = @waits.size
    def waiting?(fiber) = @waits.key?(fiber)

    # May the request timeout's notice be raised here and now (from the trap, on the loop's thread)?
    # Yes in the app's code: a fiber of ours running its body, or the loop's fiber running app.call.
    # No in this scheduler's own code (#own), nor on the loop's fiber while a fiber of ours is being
    # run (it gave the loop back: the switch is not over yet).
    def interruptible? = !@own && (@current.nil? || !Fiber.current.equal?(@loop))

    # The code that runs from now is the server's, not the app's: no notice is raised in it
    # (Streams#start's bookkeeping, and the rest of a request whose body now waits on its fiber),
    # until #disown! (AppRunner::Inline: the request is over) or a fiber of ours runs.
    def own! = (@own = true)
    def disown! = (@own = false)

    # Runs block on a new non-blocking fiber until it finishes or first waits. The block's value when
    # it finished, else nil (fiber.alive? says which). From the loop's fiber.
    def start(fiber)
      switch_to(fiber, nil, false)
    end

    # Resumes a fiber waiting here with value (an Exception is raised where it waits) and runs it until
    # it finishes or waits again. false when it was not waiting (already woken, or finished).
    def resume(fiber, value)
      return false unless (wait = @waits.delete(fiber))

      cancel(wait)
      switch_to(fiber, value, true)
      true
    end

    # From now on every wait raises `error` at once (the worker stops; Streams ends its streams).
    def stop(error) = (@stopping = error)

    # The loop's wait ends by then (monotonic seconds), or `t` if sooner. Cancelled timers are dropped.
    def next_deadline(t)
      while (first = @timers.first)
        return first.at < t ? first.at : t if first.wait || first.any

        heap_pop
      end
      t
    end

    # Fires the timers due at `now`.
    def run_timers(now)
      while (first = @timers.first) && first.at <= now
        heap_pop
        if first.any # timeout_after: whatever the fiber waits for now
          resume(first.fiber, first.value.call) if @waits.key?(first.fiber)
        elsif (wait = first.wait) && @waits[first.fiber].equal?(wait)
          resume(first.fiber, first.value)
        end
      end
    end

    # The wake-up pipe is readable: the fibers unblocked since are resumed.
    def on_wake
      @wake_r.read_nonblock(64, exception: false)
      @signaled = false # (before the list is drained: an unblock after this writes again)
      until @ready.empty?
        blocker, fiber, interrupted = @ready.pop
        wait = @waits[fiber]
        if blocker.is_a?(Exception) # #fiber_interrupt, #io_close: the wait it was told of, if it still waits
          resume(fiber, blocker) if wait && (interrupted.nil? || wait.equal?(interrupted))
        elsif wait && (wait.blocker ? wait.blocker.equal?(blocker) : wait.fd.nil?)
          resume(fiber, true) # (Ruby unblocks a fiber it put to sleep too: Mutex#sleep, IO#close's wait)
        end
      end
    end

    # Ruby 3.4 and older tell a scheduler of no close (no io_close, no fiber_interrupt): a fiber
    # waiting on a descriptor that is closed meanwhile would wait on for ever (epoll forgets a closed
    # file by itself). The loop looks on its tick (Worker#tick; #run, every turn): each such fiber is
    # resumed with the IOError a blocked thread gets, and the number is forgotten without a call to
    # the poller (it may be another file's by now). Nothing to do when no fiber waits on a descriptor.
    def reap_closed
      return if @io.empty?

      @io.keys.each do |fd|
        waits = @io[fd] # (a fiber resumed below may have ended its wait on another: nil then)
        next unless waits&.any? { |w| w.io&.closed? }

        forget_closed_fd(fd)
        waits.each { |w| resume(w.fiber, IOError.new(STREAM_CLOSED)) if @waits[w.fiber].equal?(w) }
      end
    end

    # Ruby 3.4 and older, when a descriptor a fiber of ours waits on is closed by another thread,
    # raise the closer's IOError in whatever this thread runs then ("stream closed in another thread":
    # a pending interrupt, for want of fiber_interrupt), which is the loop. The loop runs inside this:
    # that interrupt is never raised on this thread (#reap_closed resumes the waiter instead). Only
    # IOError's pending interrupts: the request timeout's notice is raised by the trap itself.
    # Such interrupts still pending when it ends are dropped (they were meant for fibers long resumed).
    def guard_loop
      Thread.handle_interrupt(IOError => :never) do
        yield
      ensure
        begin # (one raised per pass, until none is left; Thread.pending_interrupt?(IOError) crashes Ruby 3.1.2)
          Thread.handle_interrupt(IOError => :immediate) { Thread.pass }
        rescue IOError
          retry
        end
      end
    end

    # An fd a fiber waits on became ready (events: Native::Poller's IN, OUT, ERR). False when it is
    # none of the scheduler's (the wake-up pipe included: #on_wake).
    def io_ready(fd, ev)
      return on_wake || true if fd == @wake_r.fileno
      return false unless (waits = @io[fd])

      waits.dup.each do |wait|
        ready = 0
        ready |= IO::READABLE if ev & (IN | ERR) != 0 && wait.events & IO::READABLE != 0
        ready |= IO::PRIORITY if ev & (IN | ERR) != 0 && wait.events & IO::PRIORITY != 0
        ready |= IO::WRITABLE if ev & (OUT | ERR) != 0 && wait.events & IO::WRITABLE != 0
        resume(wait.fiber, ready) if ready != 0 && @waits[wait.fiber].equal?(wait)
      end
      true
    end

    # Without the worker (a unit test, or Ruby closing the scheduler): runs the loop itself until no
    # fiber waits here.
    def run
      guard_loop { run_turns }
    end

    def run_turns # (#run's loop, inside #guard_loop)
      events = []
      until @waits.empty?
        reap_closed
        t = next_deadline(now + 1)
        ms = @timers.empty? && @io.empty? && @ready.empty? ? 1000 : ((t - now) * 1000).ceil.clamp(0, 1000)
        @poller.wait(ms, events)
        i = 0
        while i < events.size
          io_ready(events[i], events[i + 1])
          i += 2
        end
        run_timers(now)
      end
    end

    private :run_turns

    # Ruby calls this when the scheduler is replaced (Fiber.set_scheduler) or its thread ends: the
    # worker has ended every stream by then; nothing more runs here.
    def close
      @poller.delete(@wake_r.fileno) rescue nil # rubocop:disable Style/RescueModifier -- (the poller may be closed)
      @wake_r.close unless @wake_r.closed?
      @wake_w.close unless @wake_w.closed?
    end

    # ---- the hooks (Fiber::Scheduler) ----

    # sleep: wakes after duration seconds (nil: when resumed).
    def kernel_sleep(duration = nil)
      return blocking_sleep(duration) unless ours?

      own do
        wait = Wait.new(Fiber.current)
        wait.timer = add_timer(duration, wait, nil) if duration
        suspend(wait)
      end
      nil
    end

    # Queue#pop, Mutex#lock, ConditionVariable#wait, Thread#join: true when unblocked, false when
    # timeout seconds passed first.
    def block(blocker, timeout = nil)
      return blocking_block(blocker, timeout) unless ours?

      own do
        wait = Wait.new(Fiber.current, blocker)
        wait.timer = add_timer(timeout, wait, false) if timeout
        suspend(wait)
      end
    end

    # May be called from any thread (on the loop's, it is this scheduler's code: #own).
    def unblock(blocker, fiber)
      fb = @fallback
      if fb && fb[0].equal?(fiber) # the loop's own thread waits in #blocking_block
        fb[2].write_nonblock(".", exception: false)
        return
      end
      return own { ready(blocker, fiber) } if Thread.current.equal?(@thread)

      ready(blocker, fiber)
    end

    # IO#wait_readable, a read or write on a non-blocking IO that would block: the events ready, or
    # false when timeout seconds passed first.
    def io_wait(io, events, timeout = nil)
      return blocking_io_wait(io, events, timeout) unless ours?

      own do
        fd = io.fileno
        wait = Wait.new(Fiber.current, nil, fd, events, nil, io)
        wait.timer = add_timer(timeout, wait, false) if timeout
        (@io[fd] ||= []) << wait
        reregister(fd, nil)
        suspend(wait)
      end
    end

    # Ruby 4.0 and later: a descriptor is being closed (IO#close, before close(2)). A fiber still
    # waiting on it is resumed with the IOError a blocked thread gets (Ruby tells it through
    # #fiber_interrupt first; this catches what is left), and the poller forgets the number now,
    # while it is still this file's. nil: Ruby closes it as usual. (Ruby 3.4 and older call
    # neither hook: see docs/ARCHITECTURE.md, "Long streams".)
    def io_close(fd)
      own do
        if (waits = @io[fd])
          waits.dup.each { |w| resume_later(w.fiber, IOError.new(STREAM_CLOSED)) if @waits[w.fiber].equal?(w) }
        end
        forget_fd(fd)
      end
      nil
    end

    # Ruby 4.0 and later: an operation of `fiber` is to end with `error` (a descriptor it waits on is
    # being closed, IO#close from any thread): it is resumed with the error raised where it waits, from
    # the loop (the closer goes on at once, as it would if the waiter were a thread). May be called
    # from any thread.
    def fiber_interrupt(fiber, error)
      return own { resume_later(fiber, error) } if Thread.current.equal?(@thread)

      resume_later(fiber, error)
    end

    # Timeout.timeout inside one of our fibers: the timer raises `error` where the fiber waits. In a
    # blocking fiber Timeout asks no scheduler; in another non-blocking one (an Enumerator's inside
    # app.call) a thread raises it, as Timeout's own does (#blocking_timeout).
    # (`error`: a class or an instance, as Timeout passes; `args`: its message.)
    def timeout_after(duration, error, *args, &block)
      return yield(duration) unless duration
      return blocking_timeout(duration, error, args, &block) unless ours?

      timer = own { add_timer(duration, nil, -> { error.exception(*args) }, Fiber.current) }
      begin
        yield duration
      ensure
        timer.any = false # cancelled
      end
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # Puts fiber on the ready list (value: true for an unblocked blocker, an Exception to raise where
    # it waits) and wakes the loop. From any thread: the list has its own lock.
    def ready(value, fiber, wait = nil)
      @ready.push([value, fiber, wait])
      return if @signaled # (read after the push: the loop clears it before it drains the list)

      @signaled = true
      @wake_w.write_nonblock(".", exception: false)
    end

    def resume_later(fiber, error) = ready(error, fiber, @waits[fiber])

    # A descriptor closed already (Ruby told us nothing): forgotten here only (the poller dropped it
    # when it closed, and the number may be another file's now).
    def forget_closed_fd(fd)
      waits = @io.delete(fd)
      waits.each { |w| w.fd = nil }
      (@registered ||= {}).delete(fd)
    end

    # A descriptor that is being closed: the poller and this scheduler forget it (its waits stay until
    # their fibers are resumed, and are no longer the fd's).
    def forget_fd(fd)
      return unless (waits = @io.delete(fd))

      waits.each { |w| w.fd = nil }
      @poller.delete(fd) if (@registered ||= {}).delete(fd)
    end

    # A hook may suspend only on a fiber this loop runs (or one it resumed: an Enumerator's).
    def ours? = !@current.nil? && !Fiber.current.equal?(@loop)

    def switch_to(fiber, value, hooked)
      raise "[BUG] Scheduler: fibers are resumed from the loop's fiber only" unless Fiber.current.equal?(@loop)

      outer = @current
      own = @own
      @own = true # (the switch is this scheduler's code, until the fiber runs)
      @current = fiber # (from here the loop's fiber takes no notice: #interruptible?)
      begin
        @hooks&.before(fiber) if hooked
        @own = false
        fiber.transfer(value)
      ensure
        @own = true
        @hooks&.after(fiber) if hooked
        @current = outer
        @own = own
      end
    end

    # Runs the block as this scheduler's own code (a hook's bookkeeping on the fiber that called it):
    # no timeout notice is raised in it. A hook that suspends inside gets the fiber's own state back
    # when it is resumed (#switch_to clears it before the switch).
    def own
      was = @own
      @own = true
      yield
    ensure
      @own = was
    end

    def suspend(wait)
      if (error = @stopping)
        cancel(wait)
        raise error.exception
      end
      @hooks.suspending(wait.fiber) if @suspending
      @waits[wait.fiber] = wait
      value = @loop.transfer
      raise value if value.is_a?(Exception)

      value
    end

    # The wait is over (it ended, or another cause woke its fiber): its timer and fd are forgotten.
    def cancel(wait)
      wait.timer&.wait = nil
      return unless (fd = wait.fd) && (waits = @io[fd])

      waits.delete(wait)
      reregister(fd, waits)
    end

    # The poller watches fd for the union of what its waits want (none left: not at all).
    def reregister(fd, waits)
      waits ||= @io[fd]
      mask = 0
      waits.each do |w|
        mask |= IN if w.events & (IO::READABLE | IO::PRIORITY) != 0
        mask |= OUT if w.events & IO::WRITABLE != 0
      end
      registered = @registered ||= {}
      return if registered[fd] == mask

      @poller.delete(fd) if registered[fd]
      if mask.zero?
        registered.delete(fd)
        @io.delete(fd)
      else
        @poller.add(fd, mask)
        registered[fd] = mask
      end
    end

    def add_timer(seconds, wait, value, any_of = nil)
      timer = Timer.new(now + seconds, @seq += 1, any_of || wait.fiber, wait, value, !any_of.nil?)
      heap_push(timer)
      timer
    end

    # ---- the timer heap: a binary heap on [at, seq] in @timers ----

    def earlier?(a, b) = a.at < b.at || (a.at == b.at && a.seq < b.seq)

    def heap_push(timer)
      h = @timers
      h << timer
      i = h.size - 1
      while i.positive?
        parent = (i - 1) / 2
        break unless earlier?(h[i], h[parent])

        h[i], h[parent] = h[parent], h[i]
        i = parent
      end
    end

    def heap_pop
      h = @timers
      last = h.pop
      return if h.empty?

      h[0] = last
      i = 0
      loop do
        l = (2 * i) + 1
        r = l + 1
        m = i
        m = l if l < h.size && earlier?(h[l], h[m])
        m = r if r < h.size && earlier?(h[r], h[m])
        break if m == i

        h[i], h[m] = h[m], h[i]
        i = m
      end
    end

    # ---- outside our fibers: wait the thread, as Ruby does without a scheduler ----
    # (IO.select asks no scheduler that has no io_select hook.)

    def blocking_sleep(duration)
      IO.select(nil, nil, nil, duration)
      nil
    end

    def blocking_block(_blocker, timeout)
      r, w = IO.pipe
      @fallback = [Fiber.current, r, w]
      !IO.select([r], nil, nil, timeout).nil?
    ensure
      @fallback = nil
      r&.close
      w&.close
    end

    def blocking_timeout(duration, error, args)
      target = Thread.current
      done = false
      timer = Thread.new do
        IO.select(nil, nil, nil, duration)
        target.raise(error.exception(*args)) unless done
      end
      begin
        yield duration
      ensure
        done = true
        timer.kill
      end
    end

    def blocking_io_wait(io, events, timeout)
      readers = events & (IO::READABLE | IO::PRIORITY) != 0 ? [io] : nil
      writers = events & IO::WRITABLE != 0 ? [io] : nil
      got = IO.select(readers, writers, nil, timeout)
      return false unless got

      ready = 0
      ready |= events & (IO::READABLE | IO::PRIORITY) unless got[0].empty?
      ready |= IO::WRITABLE unless got[1].empty?
      ready
    end
  end
end
