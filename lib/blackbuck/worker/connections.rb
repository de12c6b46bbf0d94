# frozen_string_literal: true

require_relative "request"
require_relative "response"

module Blackbuck
  # A worker's connections and every change of their state (docs/ARCHITECTURE.md, "One owner, one
  # state machine"): one method per transition, over state that lives in the C struct. The loop
  # (Worker) hands it what the poller saw (#on_event) and what it accepted (#take); Request and
  # Response answer what happened, the app runner runs the app, the Balancer moves connections
  # between workers; this object decides what becomes of each connection.
  #
  # It reaches the loop only through its Port (built once by Worker), never the Worker itself:
  #
  #   after_request.(served)  the loop's per-request hooks (out-of-band GC, max_memory_per_child);
  #                           nil when it has none: then a request costs no call (#served counts here)
  #   last_request.(limit)    max_requests_per_child is reached: the worker begins to stop (retires)
  #   replace.(why)           a request left the process unsafe or timed out: a fresh worker replaces it
  #   resume_accepting.()     a connection closed while the worker accepts nothing: it may resume
  #
  # The rest it is handed as collaborators (#start: the poller, the app runner, the Balancer) or as
  # arguments (woke_at: when the loop woke, with every call that may read or serve a request).
  class Connections
    # What Connections asks of the loop (the class comment); each member a callable.
    Port = Struct.new(:after_request, :last_request, :replace, :resume_accepting, keyword_init: true)

    # Connection states (Conn#state; defined in C, where the hand-off watcher reads them).
    IDLE = Native::Conn::IDLE     # keep-alive (or new), no byte of the next request yet (only these may move)
    HEAD = Native::Conn::HEAD     # part of a request head received
    BODY = Native::Conn::BODY     # reading the request body
    WRITE = Native::Conn::WRITE   # response bytes waiting for the client
    BUSY = Native::Conn::BUSY     # its request is in the app
    LINGER = Native::Conn::LINGER # closing in stages: write side shut, input discarded until the client closes
    STREAM = Native::Conn::STREAM # its response's stream body waits on a fiber (Streams); the worker is free

    PIPELINE_BATCH = 16  # pipelined requests served on one connection before others get a turn
    LINGER_SECONDS = 2   # seconds a staged close waits for the client to close its side
                         # (RFC 9112 9.6; see #close and Conn#shutdown_write)
    STOP_IDLE_DRAIN = 1  # seconds a stopping worker still answers idle keep-alive connections
                         # (with "Connection: close"), so a request racing the stop is served
    STREAM_SECONDS = Float::INFINITY # a STREAM connection's deadline while its body waits for itself
                                     # (a stream lasts as long as its body; a stop ends it: Streams#stop_all)

    SHED_HEADERS = { "content-type" => "text/plain", "retry-after" => "1" }.freeze
    SHED_BODY = ["Service Unavailable: the server is overloaded, retry shortly\n"].freeze

    IN = Native::Poller::IN
    OUT = Native::Poller::OUT
    ERR = Native::Poller::ERR

    # fd => Conn of every connection this worker owns (the loop looks its events up here); the
    # connections whose pipelined request waits its turn (#serve_ready); requests served; the
    # write_timeout (Streams: a stream waiting for its client).
    attr_reader :table, :ready, :served, :write_timeout
    # Mirrors of the loop's state, set by Worker when it changes: every app thread has a request;
    # the worker accepts nothing (a closed connection may let it resume).
    attr_writer :saturated, :paused

    # port: what the state machine asks of the loop (a Port). rewatch: a finished response's
    # connection may be out of the poller (app threads: the loop takes it out only if it becomes
    # readable while the app runs, #on_event).
    def initialize(port, config, request, scoreboard, index, rewatch:, requests_limit: 0)
      @after_request = port.after_request
      @last_request = port.last_request
      @replace = port.replace
      @resume_accepting = port.resume_accepting
      @request = request
      @scoreboard = scoreboard
      @index = index
      @rewatch = rewatch
      @table = @conns = {}
      @ready = []
      @stopping = false
      @saturated = false
      @paused = false
      @requests_limit = requests_limit
      @limited = requests_limit.positive?
      @started = 0 # requests started (max_requests_per_child counts them)
      @served = 0  # requests served (the app answered)
      # Settings read on every request, fetched once.
      @keepalive_timeout = config[:keepalive_timeout]
      @stop_idle_seconds = [STOP_IDLE_DRAIN, @keepalive_timeout].min
      @header_timeout = config[:header_timeout]
      @body_timeout = config[:body_timeout]
      @write_timeout = config[:write_timeout]
      @max_queue_time = config[:max_queue_time]
      @shed = @max_queue_time.positive?
    end

    # streams: the worker's Streams (the streams setting, one app thread), or nil.
    def start(poller, runner, balancer, streams = nil)
      @poller = poller
      @runner = runner
      @balancer = balancer
      @streams = streams
    end

    def size = @conns.size
    def [](fd) = @conns[fd]

    # A connection new to this worker (accepted, or moved here): tracked, given `seconds` for its
    # request head, and read at once (on a busy server the request is usually there already, and a
    # moved one's always is, in the socket or read already and carried with it); watched if it is
    # still waiting for more. woke_at: when the loop woke (what is read arrived by then).
    def take(conn, seconds, woke_at, moved = false)
      fd = conn.fd
      @conns[fd] = conn
      conn.enter(IDLE, seconds)
      return if @saturated && @balancer.pass_new(conn, woke_at) # no room here: it moves on at once

      if moved && conn.buffered.positive?
        progress(conn, IDLE, woke_at)
      else
        on_readable(conn, IDLE, woke_at, moved)
      end
      watch(conn, IN) if !conn.closed? && !conn.polled? && @conns.key?(fd) && conn.state != BUSY
    end

    # Only tracked and watched, given `seconds` for its head: read on the loop's next turns (a
    # stopping worker taking its listeners' queues).
    def track(conn, seconds)
      @conns[conn.fd] = conn
      conn.enter(IDLE, seconds)
      watch(conn, IN)
    end

    # What the poller saw on a connection, woken at woke_at.
    def on_event(conn, ev, woke_at)
      # (if/elsif with ==, not case/when: on every event, and == on two Integers is the VM's own)
      state = conn.state
      if state == WRITE then flush(conn, woke_at)
      elsif state == LINGER then drop(conn) if conn.discard_input
      # An app thread has its request (--threads; the connection stays in the poller while the app
      # runs, so a request costs no epoll_ctl): it became readable (a pipelined request, the client
      # closing) or writable (a 100 Continue went out). Looked at again once the app is done
      # (#finish_response watches it again).
      elsif state == BUSY then @poller.unwatch(conn)
      elsif state == STREAM then @streams.on_event(conn, ev) # (hung up, writable, or a next request)
      else
        if ev & OUT != 0
          flush_interim(conn)
          return if conn.closed?
        end
        on_readable(conn, state, woke_at) if ev & (IN | ERR) != 0
      end
    end

    # A whole request (head and body) is in: run the app, answer. True when the next request is
    # read already and may be served now (#progress). woke_at: when the loop woke.
    def serve(conn, env, woke_at)
      queued = conn.start_app(env) # BUSY; env[QUEUE_TIME]
      # max_requests_per_child: the request that reaches the limit begins the stop before it runs, so
      # its response says "Connection: close" and its client is never promised one more.
      @last_request.call(@requests_limit) if @limited && (@started += 1) >= @requests_limit
      return shed(conn) if @shed && queued > @max_queue_time
      return false unless (mode = @runner.run(conn, env, queued, woke_at)) # the app threads have it: #finished

      @served += 1
      @after_request&.call(@served) # (nil without hooks: no call)
      return finish_response(conn) if mode == Response::DONE
      return answered(conn, mode) if mode == Response::WRITTEN

      after_response(conn, mode)
    end

    # The app threads are done with these requests: the loop takes each connection back. Answers
    # whether every thread still has one (AppRunner#finished). woke_at: when the loop woke.
    def finished(woke_at)
      @saturated = @runner.finished do |conn, fd, mode|
        @served += 1
        @after_request&.call(@served)
        if mode == Response::HIJACKED
          untrack_fd(fd) if @conns[fd].equal?(conn) # (the app may have closed it: its number may be another's now)
        elsif !conn.closed? && after_response(conn, mode)
          progress(conn, IDLE, woke_at)
        end
      end
    end

    def serve_ready(woke_at)
      batch = @ready.dup
      @ready.clear
      batch.each { |conn| progress(conn, IDLE, woke_at) if @conns[conn.fd].equal?(conn) && conn.state == IDLE }
    end

    # The client is gone (end of input, a reset, it stopped reading) or a staged close is over:
    # close at once.
    def drop(conn)
      untrack_fd(conn.fd)
      @request.discard(conn) # a body it was sending
      conn.close
    end

    # A connection another worker owns now (sent over the hand-off socket): out of this worker's
    # poller first, since epoll forgets a socket only once every holder has closed it, then forgotten.
    def moved_away(conn)
      unwatch(conn)
      drop(conn)
    end

    # rack.hijack: the app takes the socket. The worker stops watching and tracking it, so a
    # hijacked connection (a WebSocket) never counts as work in flight when the worker stops.
    # (Called from Response's rack.hijack, before the app gets the socket. App threads hijack a
    # connection the loop no longer watches: #finished forgets it when the job comes back.)
    def hand_over(conn)
      unwatch(conn)
      untrack_fd(conn.fd)
    end

    def unwatch(conn) = @poller.unwatch(conn)

    # The worker stops: a response from now on says "Connection: close", and idle connections are
    # kept only until `drain_until` (a request racing the stop is served), counted from when their
    # client has taken its last answer (#expire).
    def stopping!
      @stopping = true
      drain_until = now + @stop_idle_seconds
      @conns.each_value { |c| c.shorten_deadline(drain_until) if c.state == IDLE }
    end

    # A stream's body waits on its fiber (Response::STREAMING), or waits no more for its client
    # (draining false), or does (true: write_timeout from now, and watched for OUT). read: its input is
    # read meanwhile (a hang-up, a next request; Streams#on_event), false once enough of it is.
    def stream_wait(conn, draining, read = true)
      conn.enter(STREAM, draining ? @write_timeout : STREAM_SECONDS)
      mask = (read ? IN : 0) | (draining ? OUT : 0)
      mask.zero? ? unwatch(conn) : watch(conn, mask)
    end

    # A stream ended (its fiber's last run, from the loop; Streams): its connection goes on as an
    # answered one would (keep-alive, close, drop, or the worker is replaced), and a next request read
    # meanwhile is served.
    def stream_ended(conn, mode)
      return if conn.closed? || !@conns[conn.fd].equal?(conn)

      go_on = if mode == Response::DONE || mode == Response::WRITTEN
                answered(conn, mode, true)
              else
                after_response(conn, mode)
              end
      progress(conn, IDLE, now) if go_on
    end

    # A forced stop: every connection closes now, but an app thread's (it ends with the process).
    def drop_all
      @conns.values.each { |c| drop(c) unless c.state == BUSY }
    end

    # Connections past their deadline: idle ones close (in stages), half-received requests get
    # 408, clients that stopped reading are dropped, and so are staged closes that are over. A
    # stopping worker's idle connection whose client has not taken all of its last answer yet (the
    # kernel still holds some: Conn#unsent) is kept STOP_IDLE_DRAIN more: its client is still reading
    # what promised keep-alive, and sends its next request once it has it.
    def expire(t)
      @conns.values.each do |c|
        next if c.state == BUSY # an app thread's (--threads), not the loop's

        if c.deadline <= t
          case c.state
          when HEAD, BODY then reject(c, 408)
          when STREAM then @streams.too_slow(c) # its fiber waited write_timeout for the client
          when IDLE then @stopping && c.unsent.positive? ? c.extend_deadline(@stop_idle_seconds) : close(c)
          else drop(c)
          end
        elsif @request.too_slow?(c, t)
          reject(c, 408)
        end
      end
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # moved: the connection was just taken off the hand-off socket.
    def on_readable(conn, state, woke_at, moved = false)
      # Every app thread is busy: a request waiting on the hand-off socket goes first, and this one
      # may move on (Balancer#pass_on).
      return if @saturated && state == IDLE && @balancer.pass_on(conn, moved, woke_at)

      r = conn.fill(woke_at)
      return if r.nil?
      return drop(conn) if r == 0 # (== 0: no method call on the hot path)

      progress(conn, state, woke_at)
    end

    # What the bytes read so far make of the request on this connection (Request#advance answers),
    # and the state the connection goes to: the one place that moves a connection through its states
    # as it reads, on the loop thread. Pipelined requests already read are answered in turn here (a
    # loop, not a recursion), PIPELINE_BATCH in a row at most before other connections get a turn.
    # woke_at: when the loop woke (the app threads' queue counts from then).
    def progress(conn, state, woke_at)
      r = @request.advance(conn, state == BODY)
      while r.is_a?(Hash)
        return unless serve(conn, r, woke_at)

        state = IDLE
        r = @request.advance(conn, false)
      end
      case r
      when Request::HEAD
        # the clock for a whole head starts with its first byte
        conn.enter(HEAD, @header_timeout) if state == IDLE && conn.buffered.positive?
      when Request::BODY
        conn.enter(BODY, @body_timeout) # the clock restarts with every part of the body that arrives
        watch(conn, IN | OUT) if conn.pending_output? # a 100 Continue the socket did not take
      when Request::PROXY # the PROXY header is in: the clock is a fresh connection's, the request next
        conn.extend_deadline(@header_timeout)
        progress(conn, IDLE, woke_at) if conn.buffered.positive?
      when Request::PROXY_PART then nil
      when Request::DROP then drop(conn)
      else reject(conn, r)
      end
    end

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
      when Response::STREAMING then stream_wait(conn, @streams.draining?(conn))
      when Response::RETIRE_WRITTEN, Response::RETIRE_CLOSE, Response::RETIRE_DROP, Response::RETIRE_STREAMING
        @replace.call("its request timed out or left the process unsafe (logged above)")
        if mode == Response::RETIRE_STREAMING # the body waits on its fiber: it ends with the worker's stop
          stream_wait(conn, @streams.draining?(conn))
          return false
        end
        return answered(conn) if mode == Response::RETIRE_WRITTEN

        mode == Response::RETIRE_CLOSE ? close(conn) : drop(conn)
      end
      false # HIJACKED: the app's now (#hand_over)
    end

    # The response is written (DONE) or maybe partly queued (WRITTEN): wait for the client to take
    # the rest, or go on (true: with the next request, read already; #progress).
    def answered(conn, mode = Response::WRITTEN, rewatch = @rewatch)
      return finish_response(conn, rewatch) unless mode != Response::DONE && conn.pending_output?

      conn.enter(WRITE, @write_timeout)
      watch(conn, OUT)
      false
    end

    # The response is out: keep the connection for the next request, or close it (Conn#next_request
    # decides). rewatch: it was watched for OUT while its response was sent, or (app threads) maybe not
    # at all (Poller#watch makes no system call when it is watched for IN already).
    # True when the next request is read already and may be served now (#progress).
    #
    # A stopping worker gets here with keep-alive only for a response whose head was written before
    # the stop began (every later one says "Connection: close"): its client may read it for seconds
    # yet (the last byte has only reached the kernel) and then sends its next request here. So the
    # promise is kept: a retiring worker moves the connection to a sibling now, as it moved its idle
    # ones when the retirement began (Balancer#move_idle_later); otherwise it drains as idle ones do,
    # STOP_IDLE_DRAIN from when the client has taken the answer (#expire), and that next request is
    # answered with "Connection: close".
    def finish_response(conn, rewatch = @rewatch)
      unless (buffered = conn.next_request(@stopping ? @stop_idle_seconds : @keepalive_timeout))
        close(conn)
        return false
      end
      return false if @stopping && buffered.zero? && @balancer.move_idle_later(conn)

      watch(conn, IN) if rewatch
      return false if buffered.zero?

      # Pipelined requests: answer in order, but give other connections a turn now and then.
      return true unless (conn.requests % PIPELINE_BATCH).zero?

      @ready << conn
      false
    end

    # The worker is done with a connection whose output is all sent (or that it answered with an
    # error): a staged close. Its write side is shut, and a client that may still be sending keeps
    # the connection, its input read and discarded, until it closes too or LINGER_SECONDS pass: a
    # socket closed with unread input is reset by the kernel, and a reset can destroy responses the
    # client has not read yet (RFC 9112 9.6).
    def close(conn)
      return drop(conn) unless conn.shutdown_write

      conn.enter(LINGER, LINGER_SECONDS)
      watch(conn, IN)
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
    def flush(conn, woke_at)
      case conn.flush
      when Native::Conn::WRITE_DONE then progress(conn, IDLE, woke_at) if finish_response(conn, true)
      when Native::Conn::WRITE_PENDING then conn.extend_deadline(@write_timeout)
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

    def watch(conn, mask) = @poller.watch(conn, mask)

    def untrack_fd(fd)
      @conns.delete(fd)
      @resume_accepting.call if @paused
    end
  end
end
