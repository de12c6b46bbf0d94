# frozen_string_literal: true

require_relative "../errors"
require_relative "scheduler"

module Blackbuck
  # A worker's open streams (docs/ARCHITECTURE.md, "Long streams"): responses whose body (an `each`
  # body, or a Rack 3 callable body) waits, each iterated on a fiber under the worker's Scheduler so
  # that the loop serves other connections meanwhile. With app threads, an app thread hands its
  # streamed body to the loop's thread (Response::Handed, AppRunner::Threads#finished), which starts it
  # here as the one thread's Response does. Built by the Worker only with the `streams`
  # setting: without it nothing here exists and no response takes a call more.
  #
  # Response starts a stream's fiber (#start); a body that finishes at once is answered as before. One
  # that waits leaves its connection STREAM (Connections#stream_wait) and the worker free; the fiber
  # runs again when what it waits for comes (the Scheduler, through the loop), and once it ends its
  # connection goes on as any answered one (Connections#stream_ended). Every run of the fiber from the
  # loop is the app's time: the Port's run_begin / run_end (AppRunner::Inline: the scoreboard's clock,
  # which the master's request timeout watches, and the target of its notice).
  #
  #   back-pressure   a part that leaves more than STREAM_HIGH_WATER bytes queued for the client makes
  #                   the fiber wait until the client has taken all but half of it (#wrote)
  #   client gone     the poller says the connection hung up, a flush fails, or it took nothing for
  #                   write_timeout while the fiber waited for it: Response::CLOSED is raised where the
  #                   fiber waits (#on_event, #too_slow)
  #   stop            #stop_all: Blackbuck::StreamStop raised where each fiber waits, and at every
  #                   wait after (the body ends: its last chunk is written)
  class Streams
    # What Streams asks of the app runner (AppRunner::Inline), each a callable.
    Port = Struct.new(:run_begin, :run_end, keyword_init: true)

    STREAM_HIGH_WATER = 64 * 1024 # bytes of a stream's output queued for its client (Conn#queued_bytes)
                                  # after which its fiber waits until the client has taken half of them
    STREAM_LOW_WATER = STREAM_HIGH_WATER / 2 # bytes queued at which a waiting stream's fiber runs again
    READ_AHEAD_MAX = 64 * 1024 # bytes of a next request read while a stream runs; past them, its
                               # connection is not read until the stream ends

    # One open stream. finish: Response's callable for the end (body.close, rack.response_finished);
    # method, path: what the scoreboard shows while its fiber runs; draining: it waits for its client;
    # mode: what the fiber answered when it ended (a Response mode); first_wait: what runs when the
    # body first waits (Response: its head goes out then, if no part did), or nil.
    Open = Struct.new(:conn, :fiber, :method, :path, :finish, :draining, :mode, :first_wait)

    IN = Native::Poller::IN
    ERR = Native::Poller::ERR

    attr_reader :scheduler

    def initialize(port, scoreboard, index, logger)
      @run_begin = port.run_begin
      @run_end = port.run_end
      @scoreboard = scoreboard
      @index = index
      @logger = logger
      @by_fiber = {}  # Fiber => Open
      @by_fd = {}     # conn fd => Open
      @starting = nil # the Open whose fiber runs for the first time (inside the app's request)
    end

    # The loop's poller exists: the scheduler is set on the loop's thread (the loop's fiber is the
    # one that resumes the others). connections: the worker's Connections (stream_wait, stream_ended).
    def start_loop(poller, connections)
      @connections = connections
      @scheduler = Scheduler.new(poller, self)
      Fiber.set_scheduler(@scheduler)
    end

    def size = @by_fd.size
    def wake_fd = @scheduler.wake_fd
    def timers = @scheduler.timers
    def next_deadline(t) = @scheduler.next_deadline(t)
    def run_timers(now) = @scheduler.run_timers(now)
    def draining?(conn) = @by_fd[conn.fd]&.draining

    # An fd the loop does not know: the scheduler's wake-up pipe, or one a stream body waits on.
    def on_fd(fd, ev) = @scheduler.io_ready(fd, ev)

    # The loop runs inside this (Scheduler#guard_loop), and looks for descriptors closed under a
    # waiting body on its tick (Scheduler#reap_closed): what Ruby 3.4 and older do not tell a scheduler.
    def guard_loop(&) = @scheduler.guard_loop(&)
    def reap_closed = @scheduler.reap_closed

    # Runs the block (Response's writing of a streamed body) on a new fiber until it ends or first
    # waits: its value (a Response mode) when it ended, else Response::STREAMING (the fiber waits; its
    # end calls `finish`, given to #ends_with).
    #
    # The request timeout's notice is not raised in this bookkeeping (Scheduler#own!): only in the
    # body, on its fiber. When the body ended, the request goes on as the app's (Response closes the
    # body and runs the callbacks); when it waits, what is left of the request is the server's, until
    # AppRunner::Inline has it back (Scheduler#disown!).
    def start(conn, env, &block)
      scheduler = @scheduler
      scheduler.own!
      open = Open.new(conn, nil, env["REQUEST_METHOD"], env["PATH_INFO"])
      fiber = open.fiber = Fiber.new(blocking: false) do
        open.mode = block.call
      rescue RequestTimeout # the notice came as the body ended, past Response's rescues: cut short
        open.mode = Response::RETIRE_DROP
      rescue Exception => e # rubocop:disable Lint/RescueException -- a fiber's exception would end the loop
        @logger.exception("[BUG] a stream's fiber raised past Response: #{open.method} #{open.path}", e)
        open.mode = Response::DROP
      end
      @by_fiber[fiber] = open
      @by_fd[conn.fd] = open
      @starting = open
      begin
        scheduler.start(fiber)
      ensure
        @starting = nil
      end
      unless fiber.alive?
        forget(open)
        scheduler.disown!
        return open.mode
      end
      @scoreboard.streams(@index, @by_fd.size)
      Response::STREAMING
    end

    # What the stream's end is to run (Response: body.close, rack.response_finished; it answers the
    # final mode), for the stream on conn whose fiber waits now.
    def ends_with(conn, &finish)
      @by_fd.fetch(conn.fd).finish = finish
    end

    # What runs on conn's stream fiber when its body first waits (Response#stream_each: the head, if
    # no part took it out yet), from the fiber that runs the body.
    def on_first_wait(conn, &block)
      open = @by_fd[conn.fd]
      open.first_wait = block if open && Fiber.current.equal?(open.fiber)
    end

    # A part was written to conn (Response): past STREAM_HIGH_WATER, its fiber waits for the client.
    # Raises Response::CLOSED when the client is gone meanwhile.
    def wrote(conn)
      return if conn.queued_bytes <= STREAM_HIGH_WATER
      return unless (open = @by_fd[conn.fd]) && Fiber.current.equal?(open.fiber)

      open.draining = true
      @connections.stream_wait(conn, true) unless @starting # (a first run's: Connections#serve does it)
      @scheduler.kernel_sleep # until #on_event resumes it
    end

    # The poller saw conn, a STREAM connection: hung up (CLOSED is raised in its fiber), writable
    # (a draining stream's output flushed), or readable (a next request: read ahead, within limits).
    def on_event(conn, ev)
      return unless (open = @by_fd[conn.fd])
      return gone(open) if ev & ERR != 0

      read_ahead(open) if ev & IN != 0
      flush(open) if open.draining && ev & Native::Poller::OUT != 0 && @by_fd[conn.fd].equal?(open)
    end

    # A draining stream's client took nothing for write_timeout (Connections#expire).
    def too_slow(conn)
      gone(@by_fd[conn.fd]) if @by_fd.key?(conn.fd)
    end

    # The worker stops and graceful_timeout is over, or it forks the mold: StreamStop is raised where
    # each stream waits, and at every later wait; each ends (its last chunk written, its connection
    # closed as a stopping worker's are).
    def stop_all
      @scheduler.stop(StreamStop)
      @by_fiber.values.each do |open|
        wake(open, StreamStop.new("the worker stops (graceful_timeout is over)"))
      end
    end

    # ---- the scheduler's hooks (Scheduler#run's before and after; #suspending) ----

    # A stream's fiber is about to wait (on itself, as the scheduler's own code): what it asked to run
    # at its first wait runs now (#on_first_wait).
    def suspending(fiber)
      return unless (open = @by_fiber[fiber]) && (first = open.first_wait)

      open.first_wait = nil
      first.call
    end

    def before(fiber)
      return unless (open = @by_fiber[fiber])

      @run_begin.call(open.method, open.path)
    end

    def after(fiber)
      return unless (open = @by_fiber[fiber])

      @run_end.call
      ended(open) unless fiber.alive?
    end

    private

    def wake(open, value)
      @scheduler.resume(open.fiber, value)
    end

    def gone(open)
      open.draining = false
      wake(open, Response::CLOSED.new("the client went away mid-stream"))
    end

    def flush(open)
      conn = open.conn
      case conn.flush
      when Native::Conn::WRITE_FAILED then return gone(open)
      when Native::Conn::WRITE_PENDING
        return conn.extend_deadline(@connections.write_timeout) if conn.queued_bytes > STREAM_LOW_WATER
      end
      open.draining = false
      @connections.stream_wait(conn, false)
      wake(open, nil)
    end

    # Bytes from the client while its stream runs: the next request (kept for after the stream), or
    # the end of input (the client is gone).
    def read_ahead(open)
      conn = open.conn
      r = conn.fill(Process.clock_gettime(Process::CLOCK_MONOTONIC))
      return gone(open) if r == 0
      return unless conn.buffered > READ_AHEAD_MAX

      @connections.stream_wait(conn, open.draining, false) # no more is read until the stream ends
    end

    # The fiber ended: the stream's end runs (Response's finish), then its connection goes on.
    def ended(open)
      forget(open)
      @scoreboard.streams(@index, @by_fd.size)
      mode = open.finish ? open.finish.call(open.mode) : open.mode
      @connections.stream_ended(open.conn, mode)
    end

    def forget(open)
      @by_fiber.delete(open.fiber)
      @by_fd.delete(open.conn.fd) if @by_fd[open.conn.fd].equal?(open)
    end
  end
end
