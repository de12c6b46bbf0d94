# frozen_string_literal: true

require "etc"
require "stringio"
require "tempfile"
require_relative "errors"
require_relative "request"
require_relative "response"

module Blackbuck
  # A worker process: one epoll set holding the listeners, the control pipe from the master,
  # and every client connection. It runs one request at a time, but waiting (for a request
  # head, a body, an idle keep-alive client, a slow reader) never holds it: those are just
  # connections in the epoll set. See docs/ARCHITECTURE.md for one request's path.
  class Worker
    # Connection states (Conn#state).
    IDLE = 0  # keep-alive, no byte of the next request yet
    HEAD = 1  # part of a request head received
    BODY = 2  # reading the request body
    WRITE = 3 # response bytes waiting for the client
    BUSY = 4  # its request is in the app

    ACCEPT_BATCH = 64    # connections accepted per listener wake-up
    PIPELINE_BATCH = 16  # pipelined requests served on one connection before others get a turn
    TICK_SECONDS = 0.5   # timeouts, scoreboard heartbeat and process title at most this often
    STOP_IDLE_DRAIN = 1  # seconds a stopping worker still answers idle keep-alive connections
                         # (with "Connection: close"), so a request racing the stop is served

    IN = Native::Poller::IN
    OUT = Native::Poller::OUT
    ERR = Native::Poller::ERR

    attr_reader :index, :config, :logger, :scoreboard

    def initialize(index:, app:, config:, listeners:, control:, scoreboard:, logger:, requests_limit: 0)
      @index = index
      @app = app
      @config = config
      @listeners = listeners
      @control = control
      @scoreboard = scoreboard
      @logger = logger
      @requests_limit = requests_limit
      @conns = {}
      @ready = []
      @served = 0
      @stopping = false
      @exit = false
      @in_app = false
      @gc_pending = false
      @paused = false
      # Settings read on every request, fetched once.
      @max_keepalive_requests = config[:max_keepalive_requests]
      @keepalive = config[:keepalive]
      @keepalive_timeout = config[:keepalive_timeout]
      @header_timeout = config[:header_timeout]
      @write_timeout = config[:write_timeout]
      @max_connections = config[:max_connections]
      @oob_gc = config[:oob_gc]
      @oob_gc_auto = config[:oob_gc_auto]
      @max_rss_kib = config[:max_memory_per_child]
      @request = Request.new(self, config)
      @response = Response.new(self, config, app)
    end

    def run
      install_traps
      @rack_version = Blackbuck.rack_version
      @poller = Native::Poller.new(256)
      @listener_by_fd = {}
      @listeners.each do |l|
        @listener_by_fd[l.fd] = l
        @poller.add(l.fd, Native::Poller::EXCLUSIVE)
      end
      @poller.add(@control.fileno, IN)
      @scoreboard.reset(@index, Process.pid)
      @logger.info("worker #{@index} (pid #{Process.pid}) ready")
      @next_tick = now
      loop_until_done
      @logger.info("worker #{@index} (pid #{Process.pid}) exiting after #{@served} requests")
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def stopping? = @stopping

    # Called by Request once a whole request (head and body) is in: run the app, answer.
    def serve(conn, env)
      # The last response on a connection says so ("Connection: close").
      cap = @max_keepalive_requests
      conn.no_keepalive! if @stopping || !@keepalive || (cap.positive? && conn.requests + 1 >= cap)
      conn.state = BUSY
      @scoreboard.request_start(@index, env["REQUEST_METHOD"], env["PATH_INFO"])
      @in_app = true
      begin
        mode = @response.handle(conn, env)
      ensure
        @in_app = false
        @scoreboard.request_done(@index, @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE)
      end
      @served += 1
      @gc_pending = true if (@oob_gc.positive? && (@served % @oob_gc).zero?) || (@oob_gc_auto && gc_near?)
      begin_graceful_stop("served #{@served} requests") if @requests_limit.positive? && @served >= @requests_limit
      return forget(conn) if mode == :hijacked
      return if mode == :closed

      if conn.pending_output?
        conn.state = WRITE
        conn.deadline = now + @write_timeout
        watch(conn, OUT)
      else
        finish_response(conn)
      end
    end

    # Request/Response report a client that must be dropped (after an error answer, or gone).
    def drop(conn)
      forget(conn)
      conn.close
    end

    # Finish what is in flight, then exit (the master starts a replacement).
    def retire(why) = begin_graceful_stop(why)

    # A full rack.hijack: the app owns the socket now.
    def release(conn)
      @poller.delete(conn.fd) if conn.polled?
      conn.watched = 0
    end

    # Output was queued while the request is still being read (a 100 Continue the client did
    # not take): send it when the socket becomes writable.
    def flush_later(conn) = watch(conn, IN | OUT)

    private

    def install_traps
      %i[TERM INT QUIT].each { |sig| trap(sig) { @stopping_signal = true } }
      trap(:USR1) { @reopen_logs = true }
      # The master's request-timeout notice: interrupt the app where it is.
      trap(:USR2) { raise RequestTimeout, "request ran longer than #{@config[:timeout]}s" if @in_app }
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
        run_oob_gc if n.zero? && @gc_pending
        i = 0
        while i < events.size
          fd = events[i]
          ev = events[i + 1]
          i += 2
          if (conn = @conns[fd])
            on_event(conn, ev)
          elsif (l = @listener_by_fd[fd])
            accept_from(l) unless @stopping
          elsif fd == @control.fileno
            on_control
          end
        end
        serve_ready unless @ready.empty?
        tick if @stopping_signal || @reopen_logs || now >= @next_tick
      end
    end

    def wait_ms
      ms = ((@next_tick - now) * 1000).ceil
      ms.clamp(1, 1000)
    end

    def accept_from(listener)
      ACCEPT_BATCH.times do
        return if @stopping # a request served just now may have started a stop

        if @conns.size >= @max_connections
          pause_accepting
          return
        end
        conn = Native::Conn.accept(listener.fd, listener.env_template(@rack_version), listener.tcp?)
        return unless conn

        fd = conn.fd
        @conns[fd] = conn
        conn.deadline = now + @header_timeout
        # Optimistic read: on a busy server the request is usually there already.
        on_readable(conn)
        watch(conn, IN) if !conn.closed? && !conn.polled? && @conns.key?(fd)
      end
    rescue Errno::EMFILE, Errno::ENFILE => e
      @logger.warn("accept: #{e.message} (open connections: #{@conns.size}); pausing accept")
      pause_accepting
    end

    def pause_accepting
      return if @paused

      @paused = true
      @listener_by_fd.each_key { |fd| @poller.delete(fd) }
    end

    def resume_accepting
      return unless @paused && !@stopping && @conns.size < @max_connections

      @paused = false
      @listener_by_fd.each_key { |fd| @poller.add(fd, Native::Poller::EXCLUSIVE) }
    end

    def on_event(conn, ev)
      if conn.state == WRITE
        flush(conn)
      else
        flush_interim(conn) if ev & OUT != 0
        on_readable(conn) if ev & (IN | ERR) != 0 && !conn.closed?
      end
    end

    def on_readable(conn)
      r = conn.fill
      return if r.nil?
      return drop(conn) if r.zero?

      @request.advance(conn)
    end

    # The client became writable: send more. write_timeout limits how long it may take
    # nothing, so the deadline moves with every flush (a steady slow reader is fine).
    def flush(conn)
      case conn.flush
      when Native::Conn::WRITE_DONE then finish_response(conn)
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

    # The response is out: keep the connection for the next request, or close it.
    def finish_response(conn)
      conn.next_request!
      return drop(conn) if !conn.keepalive? || @stopping

      conn.state = IDLE
      conn.deadline = now + @keepalive_timeout
      watch(conn, IN) if conn.polled? # it may have been watched for OUT
      return if conn.buffered.zero?

      # Pipelined requests: answer in order, but give other connections a turn now and then.
      if (conn.requests % PIPELINE_BATCH).zero?
        @ready << conn
      else
        @request.advance(conn)
      end
    end

    def serve_ready
      batch = @ready
      @ready = []
      batch.each { |conn| @request.advance(conn) if @conns[conn.fd].equal?(conn) && !conn.closed? }
    end

    def watch(conn, mask)
      if !conn.polled?
        @poller.add(conn.fd, mask)
      elsif conn.watched != mask
        @poller.modify(conn.fd, mask)
      else
        return
      end
      conn.watched = mask
    end

    def forget(conn)
      @conns.delete(conn.fd)
      resume_accepting if @paused
    end

    def on_control
      msg = @control.read_nonblock(64, exception: false)
      return if msg == :wait_readable

      # EOF: the master is gone. Either way, stop gracefully.
      begin_graceful_stop(msg.nil? ? "master exited" : "asked by master")
      @poller.delete(@control.fileno)
    end

    def begin_graceful_stop(why)
      return if @stopping

      @stopping = true
      @stop_deadline = now + @config[:graceful_timeout]
      @logger.info("worker #{@index} (pid #{Process.pid}) stopping: #{why}")
      @listener_by_fd.each_key { |fd| @poller.delete(fd) } unless @paused
      @listeners.each { |l| l.io.close unless l.io.closed? }
      drain_until = now + STOP_IDLE_DRAIN
      @conns.each_value { |c| c.deadline = drain_until if c.state == IDLE && c.deadline > drain_until }
      @exit = true if @conns.empty?
    end

    def tick
      t = now
      @next_tick = t + TICK_SECONDS
      if @reopen_logs
        @reopen_logs = false
        @logger.reopen
      end
      if @stopping_signal
        @stopping_signal = false
        begin_graceful_stop("signal")
      end
      expire(t)
      resume_accepting if @paused # e.g. after EMFILE with no connection left to close
      check_memory unless @stopping || @max_rss_kib.zero?
      @scoreboard.tick(@index, @stopping ? Native::Scoreboard::STOPPING : Native::Scoreboard::IDLE, @conns.size)
      $0 = "blackbuck worker #{@index}#{' (stopping)' if @stopping} requests: #{@served} connections: #{@conns.size}"
      @exit = true if @stopping && (@conns.empty? || t >= @stop_deadline)
    end

    # Connections past their deadline: idle ones close quietly, half-received requests get
    # 408, clients that stopped reading are dropped.
    def expire(t)
      @conns.values.each do |c|
        if c.deadline <= t
          case c.state
          when HEAD, BODY then @request.reject(c, 408)
          else drop(c)
          end
        elsif @request.too_slow?(c, t)
          @request.reject(c, 408)
        end
      end
    end

    PAGE_KIB = Etc.sysconf(Etc::SC_PAGESIZE) / 1024

    # max_memory_per_child: a worker whose RSS has grown past the limit finishes its
    # connections and exits; the master starts a fresh one.
    def check_memory
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
