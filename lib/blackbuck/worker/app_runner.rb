# frozen_string_literal: true

require_relative "../errors"
require_relative "response"
require_relative "app_pool"
require_relative "streams"

module Blackbuck
  # Who runs the app for a worker's complete requests, chosen once when the Worker is built:
  # AppRunner::Inline (threads 1: the loop's own thread, one request at a time) or
  # AppRunner::Threads (threads > 1: the app threads of an AppPool). The loop calls the same
  # methods on either and never asks which it has:
  #
  #   start(poller)             once the poller exists (Threads: its threads and wake-up pipe)
  #   wake_fd                   the fd whose readiness means #finished has jobs (nil: never)
  #   run(conn, env, queued, woke_at)  the app's answer (a Response mode) now, or nil: later, from
  #                             #finished (woke_at: when the loop woke, where a queued request's wait starts)
  #   finished { |conn, fd, mode| }  the requests the app threads are done with; saturated? after
  #   busy, size, saturated?    requests in the runner / app threads / every thread has one
  #   room?(now), oldest_waiting, typical, take_back   the queue, for Balancer
  #   in_app?                   the app runs on the loop's thread now
  #   stop_accepting_asked      the stop-accepting signal: act now (true), or when the app starts
  #   time_out(limit)           the master's request-timeout notice (USR2, from the trap); true when
  #                             the loop should begin to retire the worker now (Threads: the other
  #                             threads' requests and the idle connections must not wait for the KILL)
  #   stopping!, tick, stop     the worker stops / a tick / the worker exits
  #
  # Either reaches the loop only through the Port (built once by Worker), never the Worker itself;
  # each uses one member:
  #
  #   stop_accepting.()   Inline: the stop-accepting signal came just before the app starts
  #                       (Worker#stop_accepting_in_app)
  #   saturated.()        Threads: every app thread has a request now (the loop stops taking work)
  #   timed_out.()        with streams: the request timeout's notice was raised in a stream's run
  #                       (the worker is replaced whatever the body does with it); from the trap, so
  #                       it only counts: the loop retires the worker at its next turn (Worker#tick)
  module AppRunner
    # What a runner asks of the loop (the module comment); each member a callable.
    Port = Struct.new(:stop_accepting, :saturated, :timed_out, keyword_init: true)

    # threads 1: the app runs on the loop's own thread. The scoreboard's request_start/request_done
    # go through the gate: the scoreboard, or the hand-off watcher when there is one (#handoff), which
    # may move this worker's waiting connections while the app runs; the Balancer releases them.
    class Inline
      # port: a Port (stop_accepting, timed_out). streams: the worker's Streams (the streams setting),
      # or nil.
      def initialize(port, request, response, scoreboard, index, streams: nil)
        @stop_accepting = port.stop_accepting
        @timed_out = port.timed_out
        @streams = streams
        @scheduler = nil # the Streams' Scheduler, once the loop has one (#start)
        @stream_run = false # a stream's fiber runs from the loop (#stream_run_begin)
        @request = request
        @response = response
        @gate = scoreboard
        @scoreboard = scoreboard
        @index = index
        @done_state = Native::Scoreboard::IDLE # the slot's state after a request (STOPPING once stopping)
        @in_app = false
        @stop_accepting_asked = false
      end

      def start(_poller)
        @scheduler = @streams&.scheduler
      end

      # Balancer#start: request_start/request_done through the hand-off watcher from now on.
      def handoff(watcher, balancer)
        @gate = watcher
        @balancer = balancer
      end

      def wake_fd = nil
      def busy = 0
      def size = 1
      def saturated? = false
      def in_app? = @in_app

      # From the trap of Messages::STOP_ACCEPTING_SIGNAL: true when the worker should close its listeners
      # now (the app runs); else remembered for the next request's start (#run).
      def stop_accepting_asked
        return true if @in_app

        @stop_accepting_asked = true
        false
      end

      # Runs the app and answers how it went (Response#handle's mode).
      def run(conn, env, queued, _woke_at)
        @gate.request_start(@index, conn, queued)
        @in_app = true
        if @stop_accepting_asked # the signal came just before: nothing read the pipe yet
          @stop_accepting_asked = false
          @stop_accepting.call
        end
        begin
          @response.handle(conn, env)
        rescue RequestTimeout # the notice came as the request ended, past Response#handle's own rescues
          Response::RETIRE_DROP
        ensure
          @in_app = false
          @scheduler&.disown! # (a body that waits made the rest of the request the server's: Streams#start)
          moved = @gate.request_done(@index, @done_state)
          @balancer.release_moved(moved) if moved
          @request.take_spilled.close! if @request.spilled
        end
      end

      def finished = nil

      # A stream's fiber runs again (Streams: its body's next part, from the loop): that is the app's
      # time too. The slot shows it running from now (the master's request timeout counts this run
      # only), and the timeout's notice is raised in it (#time_out). Not through the gate: the loop
      # holds the hand-off watcher's lock meanwhile, so nothing moves during a run.
      def stream_run_begin(method, path)
        @scoreboard.running(@index, nil, 0.0, method, path)
        @stream_run = true
        @in_app = true
      end

      # ... and has given the loop back: the slot shows the worker free again.
      def stream_run_end
        @in_app = false
        @stream_run = false
        @scoreboard.running(@index, @done_state, nil, nil, nil)
      end

      # What Streams asks of this runner (Streams::Port).
      def streams_port = Streams::Port.new(run_begin: method(:stream_run_begin), run_end: method(:stream_run_end))

      # From the USR2 trap: raised in the loop's thread, inside the app (the worker is replaced once
      # the request is over: Response::RETIRE). With streams, only where the app's code runs
      # (Scheduler#interruptible?): one that comes in the scheduler's own code or as a stream's fiber
      # gives the loop back is not raised there (it would end the loop), and answers true: the loop
      # replaces the worker (Worker#tick). One raised in a stream's run replaces the worker too, even
      # when the body rescues it (timed_out). Not in the app: nothing (false).
      def time_out(limit)
        return false unless @in_app
        return true if @scheduler && !@scheduler.interruptible?

        @timed_out.call if @stream_run
        raise @response.timeout_notice(limit)
      end

      def stopping!
        @done_state = Native::Scoreboard::STOPPING
      end

      def tick = nil
      def stop = nil
    end

    # threads > 1: the app runs on an AppPool's threads; this thread keeps the loop. A request handed
    # over (#run) is theirs until #finished gives it back: the worker's timeouts skip it, and it stays
    # in the poller unless it stirs (Connections#on_event). The scoreboard slot shows the request that
    # has run longest (#publish_running: the master's timeout watches it) and whether a thread is free
    # (#publish_free: other workers move their queued requests here while one is).
    #
    # With streams (the streams setting), an app thread does not iterate a streamed body: its Response
    # answers Response::Handed, and #finished has the loop's Response (`streamer`) run it on a stream's
    # fiber of the loop's thread (Streams), so the app thread is free again at once. Each run of such a
    # fiber is the app's time as a request's is: the slot shows it while it runs, and the request
    # timeout's notice is raised in it (#time_out).
    class Threads
      attr_reader :busy, :size

      # port: a Port (saturated, timed_out). response: what the app threads answer with (Response; a
      # stand-in in unit tests). logger: the app threads' (an exception that escapes a Response).
      # streams, streamer: the worker's Streams and the loop's Response (the streams setting), or nil.
      def initialize(port, config, app, request, scoreboard, index, logger,
                     response: Response, streams: nil, streamer: nil)
        @on_saturated = port.saturated # (the callable; #saturated? is the count)
        @timed_out = port.timed_out
        @streams = streams
        @streamer = streamer
        @scheduler = nil # the Streams' Scheduler, once the loop has one (#start)
        @stream_run = nil # when the stream's fiber that runs now on the loop's thread began this run (monotonic)
        @logger = logger
        @response = response
        @config = config
        @app = app
        @request = request
        @scoreboard = scoreboard
        @index = index
        @size = config[:threads]
        @busy = 0 # requests handed to the threads (running or queued) and not yet back
        @stopping = false
      end

      def start(poller)
        # A connection stays in the loop's poller while an app thread has its request; one the app
        # hijacks leaves it before the app gets the socket (Poller#unwatch: one C call, so the loop
        # thread, which unwatches a busy connection that becomes readable, never races it).
        @pool = AppPool.new(@logger, @config, @app, @size, response: @response,
                                                           hand_over: ->(conn) { poller.unwatch(conn) })
        poller.add(@pool.wake_fd, Native::Poller::IN)
        @scheduler = @streams&.scheduler
        publish_free
      end

      def wake_fd = @pool.wake_fd

      # True while every app thread has a request.
      def saturated? = @busy >= @size

      def in_app? = false
      def stop_accepting_asked = false # the loop is never held by the app: it reads the pipe itself

      # Hands the request to the threads; the answer comes back through #finished.
      def run(conn, env, queued, woke_at)
        @busy += 1
        @pool.push(AppPool::Job.new(conn, conn.fd, env, queued, @request.take_spilled, woke_at))
        publish_free if @busy <= @size
        if @busy >= @size # (saturated?)
          @on_saturated.call
          publish_running
        end
        nil
      end

      # Yields conn, fd (its number when handed over: a hijack detaches it) and mode for every request
      # the threads are done with; answers whether every thread still has one.
      def finished
        @pool.each_done do |job|
          @busy -= 1
          job.input&.close!
          @scoreboard.request_observed(@index, job.queued, job.finished - job.started)
          mode = job.mode
          mode = take_stream(job.conn, mode) if mode.is_a?(Response::Handed)
          yield job.conn, job.fd, mode
        end
        publish_running
        publish_free
        @busy >= @size # (saturated?)
      end

      def room?(now) = @pool.room?(now)
      def oldest_waiting = @pool.oldest_waiting
      def typical = @pool.typical

      # Offers each queued connection no thread has started, oldest first: those for which the block
      # returns true (it moved them) leave the runner.
      def take_back
        @pool.take_back do |job|
          next false unless yield job.conn

          @busy -= 1 # (only a request without a body moves: no tempfile to close)
          true
        end
      end

      # From the USR2 trap, on the loop's thread: a stream's run there that has run `limit` gets the
      # notice where its body's code is (Scheduler#interruptible?; as AppRunner::Inline#time_out),
      # or, caught in the scheduler's own code, the worker retires (true). Else the app thread whose
      # request has run longest gets it (true when sent).
      def time_out(limit)
        if (began = @stream_run) && Process.clock_gettime(Process::CLOCK_MONOTONIC) - began >= limit
          return true unless @scheduler.interruptible?

          @timed_out.call
          raise @streamer.timeout_notice(limit)
        end
        @pool&.time_out_oldest(limit)
      end

      # A stream's fiber runs again on the loop's thread (Streams::Port#run_begin): the slot shows it
      # as the request running now, until #stream_run_end shows the app threads' oldest again.
      def stream_run_begin(method, path)
        @stream_run = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        @shown_job = nil
        state = @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE
        @scoreboard.running(@index, state, 0.0, method, path)
      end

      def stream_run_end
        @stream_run = nil
        publish_running(true)
      end

      def stopping!
        @stopping = true
        publish_free # 0: no request moves here any more
      end

      def tick = publish_running(true) # (Scoreboard#tick has just written the slot's state)
      def stop = @pool&.stop

      private

      # A streamed body an app thread handed over (Response::Handed): the loop's Response runs it on a
      # stream's fiber now, its first run timed as any run of it (#stream_run_begin); the mode.
      def take_stream(conn, handed)
        env = handed.env
        stream_run_begin(env["REQUEST_METHOD"], env["PATH_INFO"])
        begin
          @streamer.take_stream(conn, handed)
        rescue RequestTimeout # the notice came as the first run ended, past Response's rescues
          Response::RETIRE_DROP
        ensure
          @scheduler.disown! # (a body that waits made the rest the server's: Streams#start)
          stream_run_end
        end
      end

      # (A request the slot shows already is not written again, unless `force`: the slot holds the same.)
      def publish_running(force = false)
        job = @pool.oldest_job
        state = @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE
        return if job.equal?(@shown_job) && state == @shown_state && !force

        @shown_job = job
        @shown_state = state
        return @scoreboard.running(@index, state, nil, nil, nil) unless job

        env = job.env
        age = Process.clock_gettime(Process::CLOCK_MONOTONIC) - job.started
        @scoreboard.running(@index, state, age, env["REQUEST_METHOD"], env["PATH_INFO"])
      end

      # Whether this worker has a free app thread, in its slot: siblings move requests queued for their
      # own threads here while it has (Scoreboard#free_elsewhere?). Written when the answer changes,
      # not with every request. (Only this runner writes it.)
      def publish_free
        free = @stopping || @busy >= @size ? 0 : 1
        return if free == @free_shown

        @free_shown = free
        @scoreboard.free_threads(@index, free)
      end
    end
  end
end
