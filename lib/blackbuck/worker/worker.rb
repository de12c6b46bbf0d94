# frozen_string_literal: true

require "io/wait"
require "etc"
require "stringio"
require "tempfile"
require_relative "../errors"
require_relative "request"
require_relative "response"
require_relative "connections"
require_relative "app_runner"
require_relative "balancer"
require_relative "streams"
require_relative "episode"
require_relative "../memory"
require_relative "../master/worker_exits"
require_relative "../messages"
require_relative "../version"

module Blackbuck
  # A worker process: one epoll set holding the listeners, the control pipe from the master,
  # the hand-off socket, and every client connection. It runs one request at a time, but waiting
  # (for a request head, a body, an idle keep-alive client, a slow reader) never holds it: those
  # are just connections in the epoll set. And a request that arrives on one of its connections
  # while the app runs long does not wait for it: the hand-off watcher (Native::Handoff) moves that
  # connection to a free worker. See docs/ARCHITECTURE.md for one request's path.
  #
  # This is the loop: the poller, listeners, control pipe, ticks and signals. Its collaborators, each
  # built once here for the worker's mode: Connections (every connection's state machine), an app
  # runner (AppRunner::Inline or ::Threads) and the Balancer (moves between workers, and the one
  # "room for one more?"). None of them holds this Worker: each gets a narrow port (its class's
  # Port, a Struct of the few callables it may call back, built once here: #ports), the loop's
  # woke_at as an argument, and answers what the loop is to do (Balancer#adopt_one, #saturated).
  class Worker
    # Connection states (Conn#state; Connections changes them).
    IDLE = Connections::IDLE
    HEAD = Connections::HEAD
    BODY = Connections::BODY
    WRITE = Connections::WRITE
    BUSY = Connections::BUSY
    LINGER = Connections::LINGER
    STREAM = Connections::STREAM

    ACCEPT_BATCH = 64    # connections accepted per listener wake-up
    PIPELINE_BATCH = Connections::PIPELINE_BATCH
    LINGER_SECONDS = Connections::LINGER_SECONDS
    TICK_SECONDS = 0.5   # timeouts, scoreboard heartbeat and process title at most this often
    PROXY_HEADER_SECONDS = 5 # seconds a proxy_protocol listener's connection has to send its PROXY
                             # header (the spec: at least 3, for a TCP retransmit); header_timeout if shorter

    QUEUE_TIME = "blackbuck.queue_time" # env key: seconds the request waited for the app (Float)
    NO_TIMERS = [].freeze # the stream timers' stand-in without streams (the loop asks only `empty?`)

    attr_reader :index, :config, :logger, :scoreboard

    # mold_line: where a worker told to fork the mold says it cannot (Refork; nil without reforking).
    def initialize(index:, app:, config:, listeners:, control:, scoreboard:, logger:, requests_limit: 0, handoff: nil,
                   mold_line: nil)
      @index = index
      @config = config
      @listeners = listeners
      @control = control
      @scoreboard = scoreboard
      @logger = logger
      @multithread = config[:threads] > 1
      @stopping = false
      @saturated = false     # every app thread has a request (AppRunner::Threads; never with one)
      @stop_signals = 0      # TERM/INT/QUIT received (counted in the trap)
      @stop_signals_seen = 0 # ... and acted on by #tick
      @timeout_notices = 0   # request-timeout notices the app threads were sent (counted in the trap)
      @timeout_notices_seen = 0 # ... and acted on by #tick
      @timeout_noticed = false # the master's request-timeout notice has come (the slot says :timeout on #replace)
      @exit = false
      @gc_pending = false
      @paused = false
      @listeners_closed = false # by #stop_accepting_in_app: the listeners are out of the poller for good
      @mold_line = mold_line
      @role = :worker         # :mold once told to fork the mold (#promote): what #run returns
      @retiring = false       # stopping while the siblings serve on (#retire)
      @max_keepalive_requests = config[:max_keepalive_requests]
      @keepalive = config[:keepalive]
      @header_timeout = config[:header_timeout]
      @proxy_header_timeout = [PROXY_HEADER_SECONDS, @header_timeout].min
      @max_connections = config[:max_connections]
      @memory = Memory.new(config) # max_memory_per_child, out-of-band GC
      @woke_at = now # when the loop last woke: what is readable arrived by then (the rooms get it as an argument)
      @request = Request.new(config, logger)
      connections_port, runner_port, balancer_port, streams_port = ports
      # Every connection's state machine; its table is the one the loop looks events up in.
      @connections = Connections.new(connections_port, config, @request, scoreboard, index,
                                     rewatch: @multithread, requests_limit: requests_limit)
      @conns = @connections.table
      @ready = @connections.ready
      # Streamed bodies on fibers of their own, on this thread (the streams setting; app threads hand
      # theirs over: AppRunner::Threads). nil: no stream object exists, and no response calls one.
      @streams = (Streams.new(streams_port, scoreboard, index, logger) if config[:streams])
      # This thread's Response: the app's with one app thread; with app threads, it runs the streamed
      # bodies they hand over.
      @response = Response.new(config, app, logger, @connections.method(:hand_over), streams: @streams)
      # Who runs the app: this thread (Inline) or the app threads (Threads); the loop never asks which.
      @runner = if @multithread
                  AppRunner::Threads.new(runner_port, config, app, @request, scoreboard, index, logger,
                                         streams: @streams, streamer: (@response if @streams))
                else
                  AppRunner::Inline.new(runner_port, @request, @response, scoreboard, index, streams: @streams)
                end
      # Moves between workers, and whether there is room for one more (handoff: [send end, receive
      # end] of the generation's hand-off socket pair, or nil).
      @balancer = Balancer.new(balancer_port, @connections, @runner, config, scoreboard, logger, index, handoff)
    end

    # Serves until the worker stops. Returns :worker, or :mold when it stopped to fork the mold
    # (Forker then forks it from this process, Forker#mold_from_worker: the listeners are still
    # open, the poller closed).
    def run
      install_traps
      Native::Conn.serving! # (a worker forked from the mold inherits the mold's stopped flag)
      @rack_version = Blackbuck.rack_version
      @poller = Native::Poller.new(256)
      # Each listener as #accept_from needs it, looked up once: [fd, env template, tcp, proxy_protocol,
      # index, seconds its connections have for their first head].
      @listener_by_fd = {}
      @templates = env_templates
      @listeners.each_with_index do |l, i|
        seconds = l.proxy_protocol? ? @proxy_header_timeout : @header_timeout
        @listener_by_fd[l.fd] = [l.fd, @templates[i], l.tcp?, l.proxy_protocol?, i, seconds].freeze
        @poller.add(l.fd, Native::Poller::EXCLUSIVE)
      end
      @poller.add(@control.fileno, Native::Poller::IN)
      @streams&.start_loop(@poller, @connections) # (the fiber scheduler of this thread from here on)
      @timers = @streams ? @streams.timers : NO_TIMERS
      @connections.start(@poller, @runner, @balancer, @streams)
      @balancer.start(@poller, @listeners.each_with_index.map { |l, i| [@templates[i], l.tcp?].freeze }.freeze)
      @handoff_fd = @balancer.fd
      @scoreboard.reset(@index, Process.pid)
      @runner.start(@poller)
      @wake_fd = @runner.wake_fd
      # The last response on a connection says so ("Connection: close"): keepalive off is 1.
      Native::Conn.keepalive_policy(@keepalive ? @max_keepalive_requests : 1)
      @memory.start # oob_major_gc: from here Ruby runs no major GC by itself
      @logger.info("worker #{@index} (pid #{Process.pid}) ready")
      @next_tick = now
      if @streams # (a stream's body is the app's code: ended before Ruby's own majors come back, #memory.stop)
        @streams.guard_loop do
          loop_until_done
          end_streams
        end
        Fiber.set_scheduler(nil)
      else
        loop_until_done
      end
      @memory.stop
      @runner.stop
      @balancer.stop
      if @role == :mold
        @logger.info("worker #{@index} (pid #{Process.pid}) forks the mold after #{@connections.served} requests, then exits")
        @connections.drop_all # what graceful_timeout cut short: the mold must hold no client's socket
        @poller.close
        @control.close
      else
        @logger.info("worker #{@index} (pid #{Process.pid}) exiting after #{@connections.served} requests#{@memory.peak}")
      end
      @role
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    private # (the rooms call none of these: only what their ports hold, #ports)

    # The loop is over: streams still open end now (StreamStop; a forced stop, or a mold to fork: the
    # mold holds no stream). (#run then takes the fiber scheduler off the thread.)
    def end_streams
      @streams.stop_all if @streams.size.positive?
    end

    def pause_accepting
      return if @paused

      @paused = @connections.paused = true
      @listener_by_fd.each_key { |fd| @poller.delete(fd) } unless @listeners_closed
      @balancer.intake(false)
    end

    def resume_accepting
      return unless @paused && !@stopping && @balancer.accept?

      @paused = @connections.paused = false
      @listener_by_fd.each_key { |fd| @poller.add(fd, Native::Poller::EXCLUSIVE) } unless @listeners_closed
      @balancer.intake(true) unless @runner.saturated?
    end

    # A sibling passed on a wake-up it could not use (Balancer#adopt_one), or a tick: connections may
    # wait in a listen queue that woke only a sibling (EPOLLEXCLUSIVE), which could not accept them.
    # Only a queue that has one is accepted from: Linux's accept4 takes a descriptor before it looks
    # at the queue, so a worker with none free would read EMFILE from an empty queue and pause (no
    # listener, no moved connection) for a connection that is not there.
    def accept_stranded
      return if @stopping || @paused || @listeners_closed

      @listeners.each { |l| accept_from(@listener_by_fd[l.fd]) if l.io.wait_readable(0) }
    end

    # The server stops (Supervisor#shutdown: Messages::STOP on the control pipe, then
    # Messages::STOP_ACCEPTING_SIGNAL) while this worker's app runs a request: its loop reads the pipe
    # only once the app returns, and meanwhile its listeners would keep queueing new connections for
    # it. So they close now, their queued connections taken first (#close_listeners: served after the
    # request, not reset), and once every worker's and the master's are closed a new connection is
    # refused at once: a load balancer retries it elsewhere. The request runs on; the stop itself
    # begins when the loop reads the pipe. Runs in the trap only while the app runs (the loop's state
    # is still then; the poller is safe to change from here, as the hand-off watcher's is), and never
    # raises into the app. A stray signal does nothing: the master's message must be waiting.
    def stop_accepting_in_app
      return if @stopping || @listeners_closed || !IO.select([@control], nil, nil, 0)

      @listeners_closed = true # from here the loop never touches a listener's number: it may be reused
      @listener_by_fd.each_key { |fd| @poller.delete(fd) } unless @paused
      close_listeners
    rescue StandardError
      nil # a listener left open is closed when the stop begins
    end

    # reason: why, for the master's count (WorkerExits::SAID), when the worker stops of its own accord.
    def begin_graceful_stop(why, reason = nil)
      return if @stopping

      @stopping = true
      WorkerExits.say(@scoreboard, @index, reason) if reason
      Native::Conn.stopping! # every response from now on says "Connection: close"
      @runner.stopping!
      @balancer.stopping!
      @stop_deadline = now + @config[:graceful_timeout]
      @logger.info("worker #{@index} (pid #{Process.pid}) stopping: #{why}")
      @listener_by_fd.each_key { |fd| @poller.delete(fd) } unless @paused || @listeners_closed
      close_listeners unless @role == :mold # the mold's workers serve on them
      @connections.stopping! # idle connections drain for a moment more, no longer
      @next_tick = now # tick exits once nothing is left (#drained?), from the loop
    end

    # The narrow ports of the rooms (Connections::Port, AppRunner::Port, Balancer::Port): the only
    # calls they make back into the loop, built once. A callable on a request's path (after_request
    # with per-request hooks, saturated once every app thread is busy) is the work itself, not a
    # call to a method of this Worker, so a request costs no more calls than before; the others are
    # rare and call the Worker's methods.
    def ports
      connections = Connections::Port.new(
        # One more request served (Connections#served): out-of-band GC, max_memory_per_child. nil
        # when neither is on: then Connections makes no call at all.
        after_request: (if @memory.per_request?
                          lambda do |served|
                            @gc_pending = true if @memory.gc_due?(served)
                            check_memory if @memory.check_due?(@woke_at) && !@stopping
                          end
                        end),
        # max_requests_per_child: the request that reaches the limit begins the stop before it runs,
        # so its response says "Connection: close" and its client is never promised one more.
        last_request: ->(limit) { retire("reached #{limit} requests (max_requests_per_child)", :recycle) },
        # A request timed out, or the app raised an exception after which this process is not to be
        # trusted (Response::RETIRE): a fresh worker replaces this one, the siblings serve on. The
        # slot says which (WorkerExits): :timeout once the master's notice came, else :unsafe.
        replace: ->(why) { retire(why, @timeout_noticed ? :timeout : :unsafe) },
        resume_accepting: -> { resume_accepting }
      )
      runner = AppRunner::Port.new(
        stop_accepting: -> { stop_accepting_in_app },
        # Every app thread has a request (AppRunner::Threads#run): Balancer#saturated says what stops.
        saturated: lambda do
          @saturated = @connections.saturated = true
          pause_accepting if @balancer.saturated
        end,
        # A request timeout's notice reached a stream's run (from the trap: only counted; #tick retires)
        timed_out: -> { @timeout_notices += 1 }
      )
      # A stream's fiber runs again from the loop: the app's time (the runner's clock and timeout).
      streams = Streams::Port.new(run_begin: ->(method, path) { @runner.stream_run_begin(method, path) },
                                  run_end: -> { @runner.stream_run_end })
      [connections, runner, Balancer::Port.new(pause_accepting: -> { pause_accepting }), streams]
    end

    # Each listener's env template, which C copies for every request it parses. Without app threads
    # the worker's one Request and Response add the entries they give every request (rack.input,
    # rack.hijack, rack.early_hints, rack.response_finished), so no request sets them.
    def env_templates
      defaults = @request.env_defaults.merge(@response.env_defaults) unless @multithread
      @listeners.map do |l|
        template = l.env_template(@rack_version, @multithread)
        defaults ? template.merge(defaults).freeze : template
      end
    end

    # The app threads are done with some requests: their connections go on (Connections#finished),
    # and the freed threads take new work, from the hand-off socket first (those waited longest).
    def finished
      unless (@saturated = @connections.finished(@woke_at))
        resume_accepting if @paused
        @balancer.intake(true) unless @paused
      end
      @balancer.adopt_while_room(@woke_at)
    end

    def install_traps
      # A second one forces the stop (Ctrl-C reaches the master and its workers alike).
      %i[TERM INT QUIT].each { |sig| trap(sig) { @stop_signals += 1 } }
      trap(:USR1) { @reopen_logs = true }
      # (Inline#stop_accepting_asked: now if the app runs, else once it starts, if it does)
      trap(Messages::STOP_ACCEPTING_SIGNAL) { stop_accepting_in_app if @runner.stop_accepting_asked }
      # The master's request-timeout notice: interrupt the app where it is. With app threads the loop
      # retires the worker at once (#tick): the master kills one whose request ignores the notice
      # (RequestTimeouts::KILL_GRACE), and the other threads' requests and the idle connections must
      # be done or gone by then.
      trap(:USR2) do
        @timeout_noticed = true # (before: Inline's time_out raises into the app from here)
        @timeout_notices += 1 if @runner.time_out(@config[:timeout])
      end
      trap(:HUP, "IGNORE")
      trap(:TTIN, "IGNORE")
      trap(:TTOU, "IGNORE")
      trap(:CHLD, "DEFAULT")
    end

    def loop_until_done
      events = []
      until @exit
        timeout = @ready.empty? && !@gc_pending ? wait_ms : 0
        n = @poller.wait(timeout, events)
        # what is readable now arrived by then: the start of its queue time (#now, written out: once a turn)
        @woke_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        if @gc_pending && n.zero? && @runner.busy.zero? # no client waits: out-of-band GC
          @gc_pending = false
          @memory.collect
        end
        i = 0
        while i < events.size
          fd = events[i]
          ev = events[i + 1]
          i += 2
          if (conn = @conns[fd])
            @connections.on_event(conn, ev, @woke_at)
          elsif (l = @listener_by_fd[fd])
            accept_from(l) unless @stopping
          elsif fd == @wake_fd
            finished
          elsif fd == @handoff_fd
            accept_stranded if @balancer.adopt_one(@woke_at) # a wake-up without a connection
          elsif fd == @control.fileno
            on_control
          elsif @streams # the scheduler's wake-up pipe, or a descriptor a stream's body waits on
            @streams.on_fd(fd, ev)
          end
        end
        @streams.run_timers(@woke_at) unless @timers.empty?
        @connections.serve_ready(@woke_at) unless @ready.empty?
        @balancer.move_waiting(@woke_at) if @saturated
        tick if @stop_signals > @stop_signals_seen || @timeout_notices > @timeout_notices_seen || @reopen_logs ||
                @woke_at >= @next_tick
      end
    end

    def wait_ms
      t = @next_tick
      t = @balancer.next_look(t, @woke_at) if @saturated # requests queued for a thread may move (Balancer#move_waiting)
      t = @streams.next_deadline(t) unless @timers.empty? # a stream's body sleeps, or waits with a timeout
      ms = ((t - Process.clock_gettime(Process::CLOCK_MONOTONIC)) * 1000).ceil # (#now, once a turn)
      ms.clamp(1, 1000)
    end

    def accept_from(listener)
      fd, template, tcp, proxy, index, seconds = listener
      ACCEPT_BATCH.times do
        return if @stopping || @listeners_closed # a request served just now may have started a stop

        # (Balancer#accept?, asked only when it can say no: a free thread and room for a connection say yes)
        unless @conns.size < @max_connections && (!@saturated || @balancer.accept?)
          pause_accepting
          return
        end
        conn = Native::Conn.accept(fd, template, tcp, proxy, index)
        return unless conn

        if @accept_shortage&.on? # (nil until the first EMFILE)
          @accept_shortage.over { |n, secs| "accept resumed after #{n} EMFILE retries (#{secs} s)" }
        end
        @connections.take(conn, seconds, @woke_at)
      end
    rescue Errno::EMFILE, Errno::ENFILE => e
      # The connection stays in the listen queue. #resume_accepting retries every tick and whenever one
      # of this worker's connections closes: one line per episode, not one per retry.
      (@accept_shortage ||= Episode.new(@logger)).hit do
        "accept: #{e.message} (open connections: #{@conns.size}); pausing accept, logged again when it resumes"
      end
      pause_accepting
      @balancer.pass_wake # the listener woke this worker alone: a sibling takes what waits there
    end

    # The master's message on the control pipe (Messages: messages written while the app ran are
    # read together, and the strongest counts). Bytes that are no message mean stop, as STOP does.
    def on_control
      case Messages.receive_control(@control)
      when :wait_readable then nil
      when nil # the master is gone
        @poller.delete(@control.fileno)
        begin_graceful_stop("master exited")
      when Messages::FORCE then force_stop("forced by master")
      when Messages::STOP, Messages::Unknown then begin_graceful_stop("asked by master")
      when Messages::PROMOTE then promote
      when Messages::RETIRE then retire("asked by master to retire (the others serve on)", :retire)
      else raise "[BUG] a control message Worker#on_control does not handle"
      end
    end

    # The master chose this worker to fork the mold (refork_after): it stops serving as a worker
    # would when it retires, and then forks the Mold before it exits. An app that said it is
    # no longer fork-safe (Blackbuck.no_longer_fork_safe!) is never forked again: the worker says
    # so to the master, which turns reforking off, and serves on.
    def promote
      return if @stopping # already leaving: the master forgets the promotion when it reaps this worker

      if (why = Blackbuck.fork_unsafe_reason)
        Mold.refuse(@mold_line, why)
        @logger.warn("worker #{@index} (pid #{Process.pid}) cannot fork the mold: #{why}")
        return
      end
      @role = :mold
      retire("forking the mold", :retire)
    end

    # An app thread's request was told it timed out (#install_traps): the worker retires now, not once
    # that request comes back, which it may never do (a C call holding the GVL, code rescuing
    # Exception): the master kills it KILL_GRACE seconds after the notice. Its idle connections move
    # to the siblings, and so do the requests queued for its threads (Balancer#move_queued); those the
    # other threads run finish, their responses saying "Connection: close". With streams: the notice
    # reached a stream's run on this thread, or came as a stream's fiber gave the loop back (the
    # runner's #time_out); the streams end with the stop.
    def timed_out_in_thread
      told = if @multithread
               "its thread, or a stream's run, was told to stop"
             else
               "a stream's run was told, or had just given the loop back"
             end
      retire("a request ran past the timeout (#{@config[:timeout]}s); #{told}", :timeout)
      moved = @balancer.move_queued
      @logger.info("worker #{@index} (pid #{Process.pid}) moved #{moved} queued requests to its siblings") if moved.positive?
    end

    # A stop while the siblings serve on (refork): the listeners' queues are theirs (not taken here),
    # and each idle keep-alive connection moves to them over the hand-off socket instead of being
    # closed under a client that may be sending its next request at that moment. Requests in
    # flight finish here (their responses say "Connection: close").
    def retire(why, reason)
      return if @stopping

      @retiring = true
      begin_graceful_stop(why, reason)
      moved = @balancer.move_idle
      @logger.info("worker #{@index} (pid #{Process.pid}) moved #{moved} idle connections to its siblings") if moved.positive?
    end

    # A stopping worker takes the connections already queued on its listeners before it closes them:
    # the kernel resets every connection left in a listen queue when the last copy of its listener
    # closes, and a worker that had stopped accepting (all its app threads busy without hand-off,
    # max_connections, EMFILE) leaves a queue behind. They are read and served on the loop's next
    # turns like the others (not here: a stop may begin inside Connections#serve), with
    # "Connection: close"; max_connections in all at most.
    # Each listener is closed right after its queue is taken, so what connects in between (and is
    # reset) is as little as can be.
    def close_listeners
      @listeners.each do |l|
        accept_queued(@listener_by_fd[l.fd]) unless l.io.closed? || @retiring
        l.io.close unless l.io.closed?
      end
    end

    def accept_queued(listener)
      fd, template, tcp, proxy, index, seconds = listener
      while @conns.size < @max_connections && (conn = Native::Conn.accept(fd, template, tcp, proxy, index))
        @connections.track(conn, seconds)
      end
    rescue Errno::EMFILE, Errno::ENFILE
      nil # no descriptor for the rest: they are reset as before
    end

    # A second stop request: every connection is closed now (slow readers lose what they have not
    # taken, idle ones are not drained) and the worker exits. A request in the app is not
    # interrupted: this runs between requests.
    def force_stop(why)
      begin_graceful_stop(why)
      @logger.info("worker #{@index} (pid #{Process.pid}) forcing the stop: closing #{@conns.size} connections")
      @streams.stop_all if @streams&.size&.positive? # (each ends with its last chunk, then closes below)
      @connections.drop_all
      @exit = true
    end

    def tick
      t = now
      @next_tick = t + TICK_SECONDS
      if @reopen_logs
        @reopen_logs = false
        @logger.reopen
        @logger.info("worker #{@index} (pid #{Process.pid}) USR1: reopened log file #{@config[:log]}") if @config[:log]
      end
      if @stop_signals > @stop_signals_seen
        @stop_signals_seen = @stop_signals
        @stop_signals >= 2 ? force_stop("signal again") : begin_graceful_stop("signal")
      end
      if @timeout_notices > @timeout_notices_seen
        @timeout_notices_seen = @timeout_notices
        timed_out_in_thread
      end
      @connections.expire(t)
      @streams&.reap_closed # (Ruby 3.4 and older: a descriptor closed under a waiting body)
      resume_accepting if @paused # e.g. after EMFILE with no connection left to close
      # a listen queue whose one wake-up went to a worker that could not accept (EPOLLEXCLUSIVE) waits
      # a tick at most, even when the wake-up that worker passed on was taken with a connection behind it
      accept_stranded
      check_memory unless @stopping
      @scoreboard.tick(@index, @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE, @conns.size)
      @balancer.tick(@paused)
      @runner.tick
      # graceful_timeout is over: each open stream ends now (StreamStop where it waits; its last chunk)
      @streams.stop_all if @stopping && t >= @stop_deadline && @streams&.size&.positive?
      $0 = "blackbuck worker #{@index}#{' (stopping)' if @stopping}#{' (forking the mold)' if @role == :mold} requests: #{@connections.served} connections: #{@conns.size}"
      @exit = true if @stopping && (t >= @stop_deadline || drained?)
    end

    # A stopping worker is done when it has no connection left and none waits on the hand-off
    # socket: a connection this worker moved just before the stop could otherwise be left there
    # when the whole generation stops. It takes one per call and serves it ("Connection: close").
    # A retiring worker leaves what is on the socket to its siblings (its own idle connections are there).
    def drained?
      @conns.empty? && (@retiring || !@balancer.take_left_over(@woke_at))
    end

    # max_memory_per_child: a worker whose USS (its private pages; RSS where the kernel cannot say)
    # has grown past the limit stops taking work at once, finishes its connections and exits; the
    # master starts a fresh one. Memory is looked at after a request (where it grows),
    # Memory::CHECK_SECONDS apart at most, and on every tick.
    def check_memory
      return unless (kib = @memory.over_limit(@woke_at))

      retire("#{@memory.measure.upcase} #{kib} KiB is over max_memory_per_child (#{@memory.limit_kib} KiB)", :memory)
    end
  end
end
