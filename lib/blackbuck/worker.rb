# frozen_string_literal: true

require "etc"
require "stringio"
require "tempfile"
require_relative "errors"
require_relative "request"
require_relative "response"
require_relative "app_pool"
require_relative "episode"

module Blackbuck
  # A worker process: one epoll set holding the listeners, the control pipe from the master,
  # the hand-off socket, and every client connection. It runs one request at a time, but waiting
  # (for a request head, a body, an idle keep-alive client, a slow reader) never holds it: those
  # are just connections in the epoll set. And a request that arrives on one of its connections
  # while the app runs long does not wait for it: the hand-off watcher (Native::Handoff) moves that
  # connection to a free worker. See docs/ARCHITECTURE.md for one request's path.
  class Worker
    # Connection states (Conn#state; defined in C, bb_ext.h, where the hand-off watcher reads them).
    # Every change of state is made here (docs/ARCHITECTURE.md, "One owner, one state machine").
    IDLE = Native::Conn::IDLE     # keep-alive (or new), no byte of the next request yet (only these may move)
    HEAD = Native::Conn::HEAD     # part of a request head received
    BODY = Native::Conn::BODY     # reading the request body
    WRITE = Native::Conn::WRITE   # response bytes waiting for the client
    BUSY = Native::Conn::BUSY     # its request is in the app
    LINGER = Native::Conn::LINGER # closing in stages: write side shut, input discarded until the client closes

    ACCEPT_BATCH = 64    # connections accepted per listener wake-up
    PIPELINE_BATCH = 16  # pipelined requests served on one connection before others get a turn
    QUEUE_MIN = 2        # --threads: requests a worker whose app threads are all busy queues for the
                         # next free ones: one round (as many as it has threads), this many at least;
                         # more go to the hand-off socket, for any worker
    TICK_SECONDS = 0.5   # timeouts, scoreboard heartbeat and process title at most this often
    STOP_IDLE_DRAIN = 1  # seconds a stopping worker still answers idle keep-alive connections
                         # (with "Connection: close"), so a request racing the stop is served
    LINGER_SECONDS = 2   # seconds a staged close waits for the client to close its side
                         # (RFC 9112 9.6; see #close and Conn#shutdown_write)
    PROXY_HEADER_SECONDS = 5 # seconds a proxy_protocol listener's connection has to send its PROXY
                             # header (the spec: at least 3, for a TCP retransmit); header_timeout if shorter
    STOP_MESSAGE = "q"   # from the master over the control pipe: finish what is in flight, then exit
    FORCE_MESSAGE = "f"  # from the master: close every connection now and exit (a second Ctrl-C)
    STOP_ACCEPTING_SIGNAL = :URG # from the master after STOP_MESSAGE when the whole server stops: a
                                 # worker whose app is running closes its listeners at once (#stop_accepting_in_app)

    QUEUE_TIME = "blackbuck.queue_time" # env key: seconds the request waited for the app (Float)
    SHED_HEADERS = { "content-type" => "text/plain", "retry-after" => "1" }.freeze
    SHED_BODY = ["Service Unavailable: the server is overloaded, retry shortly\n"].freeze

    IN = Native::Poller::IN
    OUT = Native::Poller::OUT
    ERR = Native::Poller::ERR

    attr_reader :index, :config, :logger, :scoreboard

    def initialize(index:, app:, config:, listeners:, control:, scoreboard:, logger:, requests_limit: 0, handoff: nil)
      @index = index
      @app = app
      @config = config
      @listeners = listeners
      @control = control
      @scoreboard = scoreboard
      @app_gate = scoreboard # request_start/request_done; the hand-off watcher's when it runs
      @logger = logger
      @requests_limit = requests_limit
      @handoff_socket = handoff # [send end, receive end] shared by the generation's workers, or nil
      @moved_in = 0
      @moved_out = 0 # by the loop thread (app threads); the watcher counts its own
      @threads = config[:threads]
      @busy = 0 # requests handed to app threads (running or queued) and not yet back
      @handoff_after = config[:handoff_after]
      @multithread = @threads > 1
      # A full round waits here, not fewer: a request moved to the hand-off socket queues behind the
      # other workers' too, and under an even load that made 1% wait a round longer (p99 61 ms against
      # 51 on the 10 ms app with 2 x 5 threads and 50 clients; a queue of 2 then).
      @queue_max = [@threads, QUEUE_MIN].max
      @conns = {}
      @ready = []
      @served = 0
      @stopping = false
      @stop_signals = 0      # TERM/INT/QUIT received (counted in the trap)
      @stop_signals_seen = 0 # ... and acted on by #tick
      @exit = false
      @in_app = false
      @gc_pending = false
      @paused = false
      @listeners_closed = false     # by #stop_accepting_in_app: the listeners are out of the poller for good
      @stop_accepting_asked = false # STOP_ACCEPTING_SIGNAL came while the app was not running
      # Settings read on every request, fetched once.
      @max_keepalive_requests = config[:max_keepalive_requests]
      @keepalive = config[:keepalive]
      @keepalive_timeout = config[:keepalive_timeout]
      @stop_idle_seconds = [STOP_IDLE_DRAIN, @keepalive_timeout].min
      @header_timeout = config[:header_timeout]
      @body_timeout = config[:body_timeout]
      @proxy_header_timeout = [PROXY_HEADER_SECONDS, @header_timeout].min
      @write_timeout = config[:write_timeout]
      @max_connections = config[:max_connections]
      @oob_gc = config[:oob_gc]
      @oob_gc_auto = config[:oob_gc_auto]
      @max_rss_kib = config[:max_memory_per_child]
      @max_queue_time = config[:max_queue_time]
      @shed = @max_queue_time.positive?
      # #counted has more to do than count only with one of these
      @count_hooks = @oob_gc.positive? || @oob_gc_auto || @max_rss_kib.positive?
      @memory_check_at = 0.0 # max_memory_per_child: when RSS is read next (#counted)
      @started = 0 # requests started (max_requests_per_child counts them)
      @woke_at = now
      @request = Request.new(config, logger)
      @response = Response.new(config, app, logger, method(:hand_over))
    end

    def run
      install_traps
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
      @poller.add(@control.fileno, IN)
      start_app_threads
      start_handoff
      @scoreboard.reset(@index, Process.pid)
      publish_free if @pool
      # The last response on a connection says so ("Connection: close"): keepalive off is 1.
      Native::Conn.keepalive_policy(@keepalive ? @max_keepalive_requests : 1)
      @logger.info("worker #{@index} (pid #{Process.pid}) ready")
      @next_tick = now
      loop_until_done
      @pool&.stop
      @handoff&.stop
      @scoreboard.moves(@index, moved_out, @moved_in) if @handoff_fd
      @logger.info("worker #{@index} (pid #{Process.pid}) exiting after #{@served} requests#{peak_rss}")
    end

    # A whole request (head and body) is in: run the app, answer. True when the next request is
    # read already and may be served now (#progress).
    def serve(conn, env)
      queued = conn.start_app(env) # BUSY; env[QUEUE_TIME]
      last_request if @requests_limit.positive? && (@started += 1) >= @requests_limit
      return shed(conn) if @shed && queued > @max_queue_time
      return dispatch(conn, env, queued) if @pool

      # The scoreboard's request_start/request_done, through the hand-off watcher when there is one
      # (it may move this worker's waiting connections in between).
      @app_gate.request_start(@index, conn, queued)
      @in_app = true
      stop_accepting_in_app if @stop_accepting_asked # the signal came just before: nothing read the pipe yet
      begin
        mode = @response.handle(conn, env)
      ensure
        @in_app = false
        moved = @app_gate.request_done(@index, @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE)
        release_moved(moved) if moved
        @request.take_spilled.close! if @request.spilled
      end
      counted
      return finish_response(conn) if mode == Response::DONE
      return answered(conn, mode) if mode == Response::WRITTEN

      after_response(conn, mode)
    end

    # True while every app thread has a request: the worker takes no new connection then, and a
    # request that arrives on one of its idle connections waits for the next free thread, @queue_max
    # of them at most (#full?); more move to the hand-off socket for any worker (#move_out).
    def saturated? = @busy >= @threads

    def full? = @busy >= @threads + @queue_max || (saturated? && !@pool.room?(@woke_at))

    # Requests wait in this worker's queue for a thread, and may move on (#move_waiting).
    def queued_here? = @pass_fd && @busy > @threads

    def moved_out = @handoff ? @handoff.moved_out : @moved_out

    # max_queue_time: a request that has already waited longer is answered 503 with Retry-After
    # instead of running, so an overloaded server sheds what its clients (or the balancer) will
    # retry, rather than serving answers nobody waits for any more.
    def shed(conn)
      @scoreboard.request_shed(@index)
      @request.take_spilled&.close!
      if conn.write_response(503, SHED_HEADERS, SHED_BODY, false) == Native::Conn::WRITE_FAILED
        drop(conn)
        return false
      end

      answered(conn)
    end

    # What Response#handle answered decides what becomes of the connection. True when the next
    # request is read already and may be served now (#progress).
    def after_response(conn, mode)
      case mode
      when Response::DONE, Response::WRITTEN then return answered(conn, mode)
      when Response::CLOSE then close(conn)
      when Response::DROP then drop(conn)
      when Response::TIMED_OUT_CLOSE, Response::TIMED_OUT_DROP
        begin_graceful_stop("a request timed out")
        mode == Response::TIMED_OUT_CLOSE ? close(conn) : drop(conn)
      end
      false # HIJACKED: the app's now (#hand_over)
    end

    # The response is written (DONE) or maybe partly queued (WRITTEN): wait for the client to take
    # the rest, or go on (true: with the next request, read already; #progress).
    def answered(conn, mode = Response::WRITTEN)
      return finish_response(conn) unless mode != Response::DONE && conn.pending_output?

      conn.state = WRITE
      conn.deadline = now + @write_timeout
      watch(conn, OUT)
      false
    end

    # The worker is done with a connection whose output is all sent (or that it answered with an
    # error): a staged close. Its write side is shut, and a client that may still be sending keeps
    # the connection, its input read and discarded, until it closes too or LINGER_SECONDS pass: a
    # socket closed with unread input is reset by the kernel, and a reset can destroy responses the
    # client has not read yet (RFC 9112 9.6).
    def close(conn)
      return drop(conn) unless conn.shutdown_write

      conn.state = LINGER
      conn.deadline = now + LINGER_SECONDS
      watch(conn, IN)
    end

    # The client is gone (end of input, a reset, it stopped reading) or a staged close is over:
    # close at once.
    def drop(conn)
      untrack(conn)
      conn.close
    end

    # rack.hijack: the app takes the socket. The worker stops watching and tracking it, so a
    # hijacked connection (a WebSocket) never counts as work in flight when the worker stops.
    # (Called from Response's rack.hijack, before the app gets the socket. App threads hijack a
    # connection the loop no longer watches: #finished forgets it when the job comes back.)
    def hand_over(conn)
      unwatch(conn)
      untrack(conn)
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    private

    # handoff_after: a watcher thread moves connections whose request waits while the app runs long
    # (Native::Handoff); every worker takes moved connections off the generation's hand-off socket
    # as it accepts new ones.
    # With app threads the loop thread is never held by the app: it moves waiting connections
    # itself, while every app thread is busy (#move_out), and needs no watcher.
    def start_handoff
      return unless @handoff_socket && @config[:handoff_after].positive?

      sender, receiver = @handoff_socket
      if @pool
        @pass_fd = sender.fileno
      else
        @handoff = @app_gate = Native::Handoff.new(@poller, sender.fileno, @config[:handoff_after], @scoreboard)
        @handoff.start
      end
      @handoff_fd = receiver.fileno
      @listener_info = @listeners.each_with_index.map { |l, i| [@templates[i], l.tcp?].freeze }.freeze
      handoff_intake(true)
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

    # --threads N > 1: the app runs on N threads of this worker (AppPool); this thread keeps the loop.
    def start_app_threads
      return if @threads == 1

      @pool = AppPool.new(self, @config, @app, @threads)
      @wake_fd = @pool.wake_fd
      @poller.add(@wake_fd, IN)
    end

    # A complete request goes to the app threads. Until it comes back (#finished) the connection is
    # theirs: out of the poller and of the timeouts (#expire skips BUSY).
    def dispatch(conn, env, queued)
      unwatch(conn) # (serve made it BUSY)
      @busy += 1
      @pool.push(AppPool::Job.new(conn, conn.fd, env, queued, @request.take_spilled, @woke_at))
      publish_free if @busy <= @threads
      if saturated?
        # Full: no more from the hand-off socket. With hand-off, new connections are still accepted
        # (a request on one moves on at once, in arrival order with the rest); without, they wait
        # in the listen queue for a worker with a free thread.
        @pass_fd ? handoff_intake(false) : pause_accepting
        publish_running
      end
      false # the app threads have it; #finished goes on with the connection
    end

    # The app threads are done with these requests: the loop takes each connection back.
    def finished
      @pool.each_done do |job|
        @busy -= 1
        conn = job.conn
        job.input&.close!
        @scoreboard.request_observed(@index, job.queued, job.finished - job.started)
        counted
        if job.mode == Response::HIJACKED
          untrack_fd(job.fd) if @conns[job.fd].equal?(conn) # (the app may have closed it: its number may be another's now)
        elsif !conn.closed? && after_response(conn, job.mode)
          progress(conn, IDLE)
        end
      end
      publish_running
      publish_free
      unless saturated?
        resume_accepting if @paused
        handoff_intake(true) unless @paused
      end
      # Requests moved to the hand-off socket have waited longest: a freed thread takes them first.
      nil while @handoff_fd && !@stopping && !full? && @conns.size < @max_connections && adopt
    end

    # Requests queued here for a thread (#full?) move on, their bytes with them, once the oldest has
    # waited handoff_after and another worker has a free thread, so none waits behind a slow request
    # while a worker is free; or once it has waited twice as long as a request typically runs (the
    # threads it waits for are held by slow ones): then to the hand-off socket, where every worker's
    # next free thread takes the oldest first.
    def move_waiting
      oldest = @pool.oldest_waiting
      return if oldest.nil? || (waited = @woke_at - oldest) < @handoff_after
      return unless waited >= @handoff_after + @pool.typical * 2 || @scoreboard.free_elsewhere?(@index)

      @pool.take_back do |job|
        next false unless job.conn.pass_request(@pass_fd)

        @busy -= 1 # (only a request without a body moves: no tempfile to close)
        @moved_out += 1
        drop(job.conn)
        true
      end
    end

    # The slot shows the request that has run longest (the master's timeout watches it).
    def publish_running
      age, method, path = @pool.oldest
      @scoreboard.running(@index, @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE, age, method, path)
    end

    # The slot shows how many app threads have nothing to run (0 once stopping): other workers move
    # their queued requests here while there are any (#move_waiting).
    def publish_free
      @scoreboard.free_threads(@index, @stopping || saturated? ? 0 : @threads - @busy)
    end

    # One more request served: OOB GC.
    def counted
      @served += 1
      return unless @count_hooks

      @gc_pending = true if (@oob_gc.positive? && (@served % @oob_gc).zero?) || (@oob_gc_auto && gc_near?)
      check_memory if @max_rss_kib.positive? && @woke_at >= @memory_check_at && !@stopping
    end

    # max_requests_per_child: the request that reaches the limit begins the stop before it runs, so
    # its response says "Connection: close" and its client is never promised one more.
    def last_request
      begin_graceful_stop("reached #{@requests_limit} requests (max_requests_per_child)")
    end

    # Every app thread is busy and a request waits on this idle connection: another worker serves
    # it (the hand-off socket; a worker takes from it only with a free thread). Not when part of it
    # was read already, or the hand-off queue is full: then it waits here for a thread.
    def move_out(conn)
      return false unless conn.pass(@pass_fd)

      @moved_out += 1
      unwatch(conn)
      drop(conn)
      true
    end

    # Connections the watcher moved to the hand-off socket while the app ran: another worker owns
    # them now. Each is unregistered (the socket lives on there, and epoll forgets a socket only
    # once every holder has closed it), its fd here closed and its Conn forgotten.
    def release_moved(fds)
      fds.each do |fd|
        conn = @conns[fd]
        next unless conn&.moved?

        @poller.delete(fd)
        drop(conn)
      end
    end

    # A connection another worker moved here: served like a fresh one, whose request is waiting.
    # One per loop turn, so free workers share the queue. A worker short of descriptors takes none
    # (Conn.receive refuses, #short_of_descriptors): the kernel would drop the socket it has no
    # descriptor for, and its client would be reset. The send end goes along for the wake-up a
    # refusing worker passes on to the others.
    def adopt
      conn = Native::Conn.receive(@handoff_fd, @listener_info, @handoff_socket[0].fileno)
      return conn if conn.nil? || conn == false

      if @handoff_shortage&.on?
        @handoff_shortage.over { |n, secs| "hand-off: taking moved connections again (#{n} refused over #{secs} s)" }
      end
      @moved_in += 1
      take(conn, @header_timeout, true)
      conn
    rescue Errno::EMFILE, Errno::ENFILE, Errno::ECONNABORTED => e
      short_of_descriptors(e)
      e.is_a?(Errno::ECONNABORTED) ? false : nil # (false: one was taken off the socket, and lost)
    end

    # Too few descriptors to take a moved connection: Conn.receive left it queued for another worker
    # (EMFILE), or the kernel dropped it (ECONNABORTED: the table filled up after the check); both
    # counted in the scoreboard slot (blackbuck_handoff_failures_total). This worker takes no
    # connection of either kind (the others do) until it has room again: #resume_accepting tries
    # every tick and whenever one of its connections closes. Logged once per episode, not per retry.
    def short_of_descriptors(err)
      (@handoff_shortage ||= Episode.new(@logger)).hit do
        fate = err.is_a?(Errno::ECONNABORTED) ? "its client was reset" : "moved connections stay queued for the others"
        "hand-off: #{err.message}: #{fate}; this worker takes no new or moved connection until it has room " \
          "(open connections: #{@conns.size})"
      end
      pause_accepting
    end

    def install_traps
      # A second one forces the stop (Ctrl-C reaches the master and its workers alike).
      %i[TERM INT QUIT].each { |sig| trap(sig) { @stop_signals += 1 } }
      trap(:USR1) { @reopen_logs = true }
      trap(STOP_ACCEPTING_SIGNAL) do
        @stop_accepting_asked = true
        stop_accepting_in_app if @in_app
      end
      # The master's request-timeout notice: interrupt the app where it is.
      trap(:USR2) do
        if @pool
          @pool.time_out_oldest(@config[:timeout])
        elsif @in_app
          raise RequestTimeout, "request ran longer than #{@config[:timeout]}s"
        end
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
        @woke_at = now # what is readable now arrived by then: the start of its queue time
        run_oob_gc if n.zero? && @gc_pending && @busy.zero?
        i = 0
        while i < events.size
          fd = events[i]
          ev = events[i + 1]
          i += 2
          if (conn = @conns[fd])
            on_event(conn, ev)
          elsif (l = @listener_by_fd[fd])
            accept_from(l) unless @stopping
          elsif fd == @wake_fd
            finished
          elsif fd == @handoff_fd
            adopt if @conns.size < @max_connections && !saturated?
          elsif fd == @control.fileno
            on_control
          end
        end
        serve_ready unless @ready.empty?
        move_waiting if queued_here?
        tick if @stop_signals > @stop_signals_seen || @reopen_logs || @woke_at >= @next_tick
      end
    end

    def wait_ms
      t = @next_tick
      # requests queued for a thread: check again when the oldest may move (#move_waiting)
      # (then every handoff_after while it still waits)
      if queued_here? && (oldest = @pool.oldest_waiting)
        t = [t, [oldest, @woke_at].max + @handoff_after].min
      end
      ms = ((t - now) * 1000).ceil
      ms.clamp(1, 1000)
    end

    def accept_from(listener)
      fd, template, tcp, proxy, index, seconds = listener
      ACCEPT_BATCH.times do
        return if @stopping || @listeners_closed # a request served just now may have started a stop

        if @conns.size >= @max_connections || (@pool && saturated? && !@pass_fd)
          pause_accepting
          return
        end
        conn = Native::Conn.accept(fd, template, tcp, proxy, index)
        return unless conn

        if @accept_shortage&.on? # (nil until the first EMFILE)
          @accept_shortage.over { |n, secs| "accept resumed after #{n} EMFILE retries (#{secs} s)" }
        end
        take(conn, seconds)
      end
    rescue Errno::EMFILE, Errno::ENFILE => e
      # The connection stays in the listen queue. #resume_accepting retries every tick and whenever one
      # of this worker's connections closes: one line per episode, not one per retry.
      (@accept_shortage ||= Episode.new(@logger)).hit do
        "accept: #{e.message} (open connections: #{@conns.size}); pausing accept, logged again when it resumes"
      end
      pause_accepting
    end

    # A connection new to this worker (accepted, or moved here): tracked, given `seconds` for its
    # request head, and read at once (on a busy server the request is usually there already, and a
    # moved one's always is, in the socket or read already and carried with it); watched if it is
    # still waiting for more.
    def take(conn, seconds, moved = false)
      fd = conn.fd
      @conns[fd] = conn
      conn.deadline = now + seconds
      return if @pass_fd && full? && move_out(conn)

      if moved && conn.buffered.positive?
        progress(conn, IDLE)
      else
        on_readable(conn, IDLE, moved)
      end
      watch(conn, IN) if !conn.closed? && !conn.polled? && @conns.key?(fd) && (!@pool || conn.state != BUSY)
    end

    def pause_accepting
      return if @paused

      @paused = true
      @listener_by_fd.each_key { |fd| @poller.delete(fd) } unless @listeners_closed
      handoff_intake(false)
    end

    def resume_accepting
      return unless @paused && !@stopping && @conns.size < @max_connections && (@pass_fd || !saturated?)

      @paused = false
      @listener_by_fd.each_key { |fd| @poller.add(fd, Native::Poller::EXCLUSIVE) } unless @listeners_closed
      handoff_intake(true) unless saturated?
    end

    # Whether the hand-off socket is in the poller (connections other workers moved are taken).
    def handoff_intake(on)
      return if @handoff_fd.nil? || @handoff_polled == on

      on ? @poller.add(@handoff_fd, Native::Poller::EXCLUSIVE) : @poller.delete(@handoff_fd)
      @handoff_polled = on
    end

    def on_event(conn, ev)
      case (state = conn.state)
      when WRITE then flush(conn)
      when LINGER then drop(conn) if conn.discard_input
      else
        if ev & OUT != 0
          flush_interim(conn)
          return if conn.closed?
        end
        on_readable(conn, state) if ev & (IN | ERR) != 0
      end
    end

    # moved: the connection was just taken off the hand-off socket.
    def on_readable(conn, state, moved = false)
      if @pass_fd && state == IDLE && saturated?
        # Requests on the hand-off socket waited longer: one of them takes the queue's room first.
        adopt if !moved && !full? && !@stopping && @conns.size < @max_connections
        return if full? && move_out(conn)
      end

      r = conn.fill(@woke_at)
      return if r.nil?
      return drop(conn) if r == 0 # (== 0: no method call on the hot path)

      progress(conn, state)
    end

    # What the bytes read so far make of the request on this connection (Request#advance answers),
    # and the state the connection goes to: the one place that moves a connection through its states
    # as it reads, on the loop thread. Pipelined requests already read are answered in turn here (a
    # loop, not a recursion), PIPELINE_BATCH in a row at most before other connections get a turn.
    def progress(conn, state)
      r = @request.advance(conn, state == BODY)
      while r.is_a?(Hash)
        return unless serve(conn, r)

        state = IDLE
        r = @request.advance(conn, false)
      end
      case r
      when Request::HEAD
        if state == IDLE && conn.buffered.positive?
          conn.state = HEAD # the clock for a whole head starts with its first byte
          conn.deadline = now + @header_timeout
        end
      when Request::BODY
        conn.state = BODY # the clock restarts with every part of the body that arrives
        conn.deadline = now + @body_timeout
        watch(conn, IN | OUT) if conn.pending_output? # a 100 Continue the socket did not take
      when Request::PROXY # the PROXY header is in: the clock is a fresh connection's, the request next
        conn.deadline = now + @header_timeout
        progress(conn, IDLE) if conn.buffered.positive?
      when Request::PROXY_PART then nil
      when Request::DROP then drop(conn)
      else reject(conn, r)
      end
    end

    # Answers a bad request with its status and closes the connection, so nothing the client sent
    # after it is ever executed (in stages, so the client can read the answer).
    def reject(conn, status)
      answered = conn.write_error(status)
      @request.discard(conn)
      answered ? close(conn) : drop(conn)
    end

    # The client became writable: send more. write_timeout limits how long it may take
    # nothing, so the deadline moves with every flush (a steady slow reader is fine).
    def flush(conn)
      case conn.flush
      when Native::Conn::WRITE_DONE then progress(conn, IDLE) if finish_response(conn, true)
      when Native::Conn::WRITE_PENDING then conn.deadline = now + @write_timeout
      when Native::Conn::WRITE_FAILED then drop(conn)
      end
    end

    # A queued 100 Continue went out (or the client is gone) while its body is awaited.
    def flush_interim(conn)
      case conn.flush
      when Native::Conn::WRITE_DONE then watch(conn, IN)
      when Native::Conn::WRITE_FAILED then drop(conn)
      end
    end

    # The response is out: keep the connection for the next request, or close it (Conn#next_request
    # decides). rewatch: it was watched for OUT while its response was sent, or (app threads) not at all.
    # True when the next request is read already and may be served now (#progress).
    def finish_response(conn, rewatch = @multithread)
      # A stopping worker keeps a connection whose response promised keep-alive as long as it
      # drains idle ones (#begin_graceful_stop).
      unless (buffered = conn.next_request(@stopping ? @stop_idle_seconds : @keepalive_timeout))
        close(conn)
        return false
      end

      watch(conn, IN) if rewatch
      return false if buffered.zero?

      # Pipelined requests: answer in order, but give other connections a turn now and then.
      return true unless (conn.requests % PIPELINE_BATCH).zero?

      @ready << conn
      false
    end

    def serve_ready
      batch = @ready
      @ready = []
      batch.each { |conn| progress(conn, IDLE) if @conns[conn.fd].equal?(conn) && conn.state == IDLE }
    end

    def watch(conn, mask)
      watched = conn.watched
      return if watched == mask

      watched.zero? ? @poller.add(conn.fd, mask) : @poller.modify(conn.fd, mask)
      conn.watched = mask
    end

    def unwatch(conn)
      return if conn.watched.zero?

      @poller.delete(conn.fd)
      conn.watched = 0
    end

    def untrack(conn) = untrack_fd(conn.fd)

    def untrack_fd(fd)
      @conns.delete(fd)
      resume_accepting if @paused
    end

    def on_control
      msg = @control.read_nonblock(64, exception: false)
      return if msg == :wait_readable

      if msg.nil? # the master is gone
        @poller.delete(@control.fileno)
        begin_graceful_stop("master exited")
      elsif msg.include?(FORCE_MESSAGE)
        force_stop("forced by master")
      else
        begin_graceful_stop("asked by master")
      end
    end

    def begin_graceful_stop(why)
      return if @stopping

      @stopping = true
      Native::Conn.stopping! # every response from now on says "Connection: close"
      publish_free if @pool # 0: no request moves here any more
      @stop_deadline = now + @config[:graceful_timeout]
      @logger.info("worker #{@index} (pid #{Process.pid}) stopping: #{why}")
      @listener_by_fd.each_key { |fd| @poller.delete(fd) } unless @paused || @listeners_closed
      close_listeners
      drain_until = now + @stop_idle_seconds
      @conns.each_value { |c| c.deadline = drain_until if c.state == IDLE && c.deadline > drain_until }
      @next_tick = now # tick exits once nothing is left (#drained?), from the loop
    end

    # A stopping worker takes the connections already queued on its listeners before it closes them:
    # the kernel resets every connection left in a listen queue when the last copy of its listener
    # closes, and a worker that had stopped accepting (all its app threads busy without hand-off,
    # max_connections, EMFILE) leaves a queue behind. They are read and served on the loop's next
    # turns like the others (not here: a stop may begin inside #serve), with "Connection: close";
    # max_connections in all at most.
    # Each listener is closed right after its queue is taken, so what connects in between (and is
    # reset) is as little as can be.
    def close_listeners
      @listeners.each do |l|
        accept_queued(@listener_by_fd[l.fd]) unless l.io.closed?
        l.io.close unless l.io.closed?
      end
    end

    # The server stops (Supervisor#shutdown: STOP_MESSAGE on the control pipe, then
    # STOP_ACCEPTING_SIGNAL) while this worker's app runs a request: its loop reads the pipe only once
    # the app returns, and meanwhile its listeners would keep queueing new connections for it. So
    # they close now, their queued connections taken first (#close_listeners: served after the
    # request, not reset), and once every worker's and the master's are closed a new connection is
    # refused at once: a load balancer retries it elsewhere. The request runs on; the stop itself
    # begins when the loop reads the pipe. Runs in the trap only while the app runs (the loop's state
    # is still then; the poller is safe to change from here, as the hand-off watcher's is), and never
    # raises into the app. A stray signal does nothing: the master's message must be waiting.
    def stop_accepting_in_app
      @stop_accepting_asked = false
      return if @stopping || @listeners_closed || !IO.select([@control], nil, nil, 0)

      @listeners_closed = true # from here the loop never touches a listener's number: it may be reused
      @listener_by_fd.each_key { |fd| @poller.delete(fd) } unless @paused
      close_listeners
    rescue StandardError
      nil # a listener left open is closed when the stop begins
    end

    def accept_queued(listener)
      fd, template, tcp, proxy, index, seconds = listener
      while @conns.size < @max_connections && (conn = Native::Conn.accept(fd, template, tcp, proxy, index))
        @conns[conn.fd] = conn
        conn.deadline = now + seconds
        watch(conn, IN)
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
      @conns.values.each { |c| drop(c) unless c.state == BUSY } # an app thread's: it ends with the process
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
      expire(t)
      resume_accepting if @paused # e.g. after EMFILE with no connection left to close
      check_memory unless @stopping || @max_rss_kib.zero?
      @scoreboard.tick(@index, @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE, @conns.size)
      @scoreboard.moves(@index, moved_out, @moved_in) if @handoff_fd
      publish_running if @pool
      $0 = "blackbuck worker #{@index}#{' (stopping)' if @stopping} requests: #{@served} connections: #{@conns.size}"
      @exit = true if @stopping && (t >= @stop_deadline || drained?)
    end

    # A stopping worker is done when it has no connection left and none waits on the hand-off
    # socket: a connection this worker moved just before the stop could otherwise be left there
    # when the whole generation stops. It takes one per call and serves it ("Connection: close").
    def drained?
      @conns.empty? && !(@handoff_fd && adopt)
    end

    # Connections past their deadline: idle ones close (in stages), half-received requests get
    # 408, clients that stopped reading are dropped, and so are staged closes that are over.
    def expire(t)
      @conns.values.each do |c|
        next if c.state == BUSY # an app thread's (--threads), not the loop's

        if c.deadline <= t
          case c.state
          when HEAD, BODY then reject(c, 408)
          when IDLE then close(c)
          else drop(c)
          end
        elsif @request.too_slow?(c, t)
          reject(c, 408)
        end
      end
    end

    # With max_memory_per_child, the exit line says how far RSS went: " (peak RSS N KiB)".
    def peak_rss
      return "" if @max_rss_kib.zero?

      " (peak RSS #{File.read('/proc/self/status')[/^VmHWM:\s*(\d+)/, 1]} KiB)"
    rescue SystemCallError
      ""
    end

    PAGE_KIB = Etc.sysconf(Etc::SC_PAGESIZE) / 1024
    MEMORY_CHECK_SECONDS = 0.01 # RSS is read at most this often while requests are served

    # max_memory_per_child: a worker whose RSS has grown past the limit stops taking work at once,
    # finishes its connections and exits; the master starts a fresh one. RSS is read after a request
    # (where memory grows), MEMORY_CHECK_SECONDS apart at most, and on every tick.
    def check_memory
      @memory_check_at = @woke_at + MEMORY_CHECK_SECONDS
      rss = File.read("/proc/self/statm").split[1].to_i * PAGE_KIB
      begin_graceful_stop("RSS #{rss} KiB is over max_memory_per_child (#{@max_rss_kib} KiB)") if rss > @max_rss_kib
    rescue SystemCallError
      @max_rss_kib = 0 # no /proc here: nothing to check
    end

    OOB_GC_FREE_SLOTS = 0.1 # fraction of live slots: fewer free slots than this and a GC is near
    OOB_GC_MALLOC = 0.9     # fraction of the malloc limit that counts as near

    # Would the next allocations trigger a GC anyway? (GC.stat(key) allocates nothing.)
    def gc_near?
      GC.stat(:heap_free_slots) < GC.stat(:heap_live_slots) * OOB_GC_FREE_SLOTS ||
        GC.stat(:malloc_increase_bytes) > GC.stat(:malloc_increase_bytes_limit) * OOB_GC_MALLOC
    end

    # Between requests, and only when no client is waiting (the loop polled with timeout 0
    # and found nothing): every oob_gc requests a full GC, with oob_gc_auto a minor one.
    def run_oob_gc
      @gc_pending = false
      full = @oob_gc.positive?
      GC.start(full_mark: full, immediate_sweep: full)
      @oob_gc_runs = (@oob_gc_runs || 0) + 1
    end
  end
end
