# frozen_string_literal: true

require_relative "../errors"
require_relative "response"

module Blackbuck
  # --threads N (N > 1): the app threads of a worker. The worker's loop thread owns every
  # connection; it hands a complete request over (#push) and takes it back when the app is done
  # (#each_done), woken by a byte on a pipe in its poller. A request pushed while every thread is
  # busy waits in the pool's queue, so the thread that frees first starts it without a round trip
  # through the loop; until a thread starts it, the loop may take it back (#take_back) to move it
  # to another worker. Between push and done, only the app thread touches that connection: the
  # loop skips it in its timeouts, and takes it out of its poller if it becomes readable meanwhile.
  # What Response#handle answers (close the connection, forget a hijacked one, retire after a
  # timeout) is written down on the job and done by the loop thread, never by the app thread.
  class AppPool
    TYPICAL_WEIGHT = 0.05 # of the latest request's run time in the moving average (#typical)

    # One request on its way through an app thread. fd: the connection's number when handed over
    # (a hijack detaches it). pushed_at: when it entered the queue (monotonic seconds). mode: what
    # Response#handle answered.
    Job = Struct.new(:conn, :fd, :env, :queued, :input, :pushed_at, :started, :finished, :mode)

    # logger: the threads' (and their Responses'). response: what each thread answers with (Response;
    # a stand-in in unit tests). hand_over: called with a connection the app hijacks, before the app
    # gets its socket (the loop stops watching it).
    def initialize(logger, config, app, size, response: Response, hand_over: nil)
      @logger = logger
      @waiting = [] # jobs no thread has started, oldest first; under @lock
      @lock = Thread::Mutex.new
      @ready = Thread::ConditionVariable.new
      @closed = false
      @done = Thread::Queue.new
      @wake_r, @wake_w = IO.pipe
      @wake_sent = false # a byte is on the pipe that the loop has not read yet: no need for another
      @running = Array.new(size) # the job each thread runs, or nil
      @typical = 0.0 # seconds a request runs, a moving average (#room?)
      @responders = Array.new(size) { response.new(config, app, logger, hand_over) }
      @threads = Array.new(size) { |i| Thread.new { work(i, @responders[i]) } }
    end

    def wake_fd = @wake_r.fileno

    # Seconds a request typically runs here (a moving average; 0 before the first).
    attr_reader :typical

    def push(job)
      @lock.synchronize do
        @waiting << job
        @ready.signal
      end
    end

    # Whether one more request may wait here for a thread (the worker keeps one round at most): only
    # while fewer wait than there are threads running a request younger than a typical one. A thread
    # held by a long request (older than that) is not counted, so a fast request does not queue
    # behind slow ones: it goes to the hand-off socket, for whichever worker frees a thread first.
    def room?(now)
      soon = 0
      limit = now - @typical
      i = 0
      while i < @running.size # (the loop asks after every request: no block, no allocation)
        job = @running[i]
        soon += 1 if job.nil? || job.started > limit
        i += 1
      end
      @waiting.size < soon
    end

    # When the oldest request no thread has started was pushed (monotonic seconds), or nil.
    def oldest_waiting = @waiting.first&.pushed_at

    # Offers each request no thread has started, oldest first, back to the loop: those for which the
    # block returns true leave the queue (the loop moved them), the others keep their turn.
    def take_back(&moved)
      @lock.synchronize { @waiting.reject!(&moved) }
    end

    # Yields every job the app threads have finished since the last call.
    def each_done
      @wake_r.read_nonblock(4096, exception: false)
      @wake_sent = false # after the pipe is read, before the queue is: a job done from here on sends a new byte
      until @done.empty?
        job = @done.pop(true)
        yield job
      end
    rescue ThreadError # empty after all
      nil
    end

    # The request that has run longest: [seconds it has run, method, path], or nil when none runs.
    def oldest
      job = oldest_job
      job && [now - job.started, job.env["REQUEST_METHOD"], job.env["PATH_INFO"]]
    end

    # The Job that has run longest, or nil when none runs. The app threads may empty their slots
    # meanwhile: each slot is read once. (The loop asks after every request: no block, no allocation.)
    def oldest_job
      best = nil
      i = 0
      while i < @running.size
        job = @running[i]
        best = job if job && (best.nil? || job.started < best.started)
        i += 1
      end
      best
    end

    # The master's request-timeout notice (USR2): the request that has run longest gets
    # RequestTimeout raised in its thread, inside the app (the client gets a 503). True when it was sent.
    def time_out_oldest(limit)
      i, job = oldest_running
      return false unless job && now - job.started >= limit

      @threads[i].raise(@responders[i].timeout_notice(limit))
      true
    end

    # The worker is exiting: the threads finish the job they run (the loop has waited for them
    # unless the stop was forced) and end.
    def stop(wait = 1)
      @lock.synchronize do
        @closed = true
        @ready.broadcast
      end
      deadline = now + wait
      @threads.each { |th| th.join([deadline - now, 0].max) }
      return if @threads.any?(&:alive?) # (one still running may yet wake the loop)

      @wake_r.close # a worker that forks the mold: the mold and its workers use pools of their own, not these
      @wake_w.close
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # [thread index, job] of the request that started first, or nil when none runs. The app threads
    # may empty their slots meanwhile: each job is read once.
    def oldest_running
      best = nil
      @running.each_with_index { |job, i| best = [i, job] if job && (best.nil? || job.started < best[1].started) }
      best
    end

    # A RequestTimeout is taken only while the app runs its request (handle_interrupt); one that
    # comes a moment too late, after the request ended, is dropped rather than hitting the next.
    def work(index, response)
      Thread.handle_interrupt(RequestTimeout => :never) do
        while (job = pop)
          job.started = now
          @running[index] = job
          begin
            job.mode = Thread.handle_interrupt(RequestTimeout => :immediate) { response.handle(job.conn, job.env) }
          rescue RequestTimeout # raised in handle's own error path: the answer is cut short
            job.mode = Response::RETIRE_DROP
          rescue Exception => e # rubocop:disable Lint/RescueException -- the loop must get its connection back
            @logger.exception("app thread", e)
            job.mode = Response::DROP
          end
          @running[index] = nil
          drop_late_timeout
          job.finished = now
          note_run_time(job.finished - job.started)
          @done.push(job)
          wake_loop
        end
      end
    end

    # A rare long request (past twice the average) moves the average as much as one twice the
    # average would: the average stays what most requests take.
    def note_run_time(seconds)
      @typical = @typical.zero? ? seconds : @typical + ([seconds, @typical * 2].min - @typical) * TYPICAL_WEIGHT
    end

    # One byte wakes the loop for every job done until it looks (#each_done).
    def wake_loop
      return if @wake_sent

      @wake_sent = true
      @wake_w.write_nonblock(".", exception: false)
    end

    # The next request to run, oldest first; nil once the pool is stopped and nothing waits.
    def pop
      @lock.synchronize do
        @ready.wait(@lock) while @waiting.empty? && !@closed
        @waiting.shift
      end
    end

    def drop_late_timeout
      return unless Thread.pending_interrupt?(RequestTimeout)

      Thread.handle_interrupt(RequestTimeout => :immediate) { Thread.pass }
    rescue RequestTimeout
      nil
    end
  end
end
