# frozen_string_literal: true

require_relative "episode"

module Blackbuck
  # Every move of a connection between a worker and the others, and the one answer to "may this
  # worker take one more?" (#room?). The generation's hand-off socket is one queue shared by its
  # workers (docs/ARCHITECTURE.md, "Hand-off"); which way this worker moves its waiting requests is
  # chosen once, when it is built, and is one of two objects with the same methods (below), which
  # Balancer calls without asking which it has:
  #
  # - LoopPasses, app threads (AppRunner::Threads) and a hand-off socket: the loop is never held by
  #   the app, so it moves them itself: a request on an idle connection of a worker whose threads are
  #   all busy and whose queue is full (#pass_on, #pass_new), and a queued request no thread has
  #   started once it has waited too long (#move_waiting);
  # - LoopKeeps, every other worker: the loop moves no request. With one app thread
  #   (AppRunner::Inline) and a hand-off socket, the app holds the loop thread, so a watcher thread
  #   (Native::Handoff, started by LoopKeeps#start) moves idle connections with a request waiting
  #   while the app runs long, and the runner returns them through #release_moved. With
  #   handoff_after 0 (no hand-off socket) nothing moves, and #room? is the connection limit and
  #   (app threads) a free thread.
  #
  # Every worker takes moved connections off the socket (#adopt) while it has room.
  #
  # It reaches the loop only through its Port (built once by Worker), never the Worker itself:
  #
  #   pause_accepting.()   out of descriptors altogether (#short_of_descriptors): accept nothing
  #
  # Everything else the loop needs to hear comes back as an answer: #adopt_one is true when the
  # listeners are to be looked at (Worker#accept_stranded), #saturated when the worker is to stop
  # accepting. And the loop hands it what it reads of the loop as arguments: woke_at (when the loop
  # woke) with every call that may take, queue or move a request, and whether it is paused (#tick).
  # Its other collaborators are the Connections (table, [], take, moved_away), the app runner, the
  # scoreboard and the logger.
  class Balancer
    # What Balancer asks of the loop (the class comment); each member a callable.
    Port = Struct.new(:pause_accepting, keyword_init: true)

    STRANDED_SECONDS = 1 # seconds a worker short of descriptors for a moved connection (BB_RECEIVE_FD_RESERVE)
                         # leaves it to workers with room; still queued then, no worker with room took it,
                         # and it takes it itself with the smaller reserve (BB_RECEIVE_FD_RESERVE_LAST)
    QUEUE_MIN = 2 # --threads: requests a worker whose app threads are all busy queues for the next
                  # free ones: one round (as many as it has threads), this many at least; more go to
                  # the hand-off socket, for any worker

    # The receive end's fd (the loop hands its events to #adopt_one), or nil without hand-off.
    attr_reader :fd, :moved_in

    # port: what it asks of the loop (a Port); conns: the worker's Connections (table, [], take,
    # moved_away). socket: [send end, receive end] of the generation's hand-off pair, or nil.
    def initialize(port, conns, runner, config, scoreboard, logger, index, socket)
      @pause_accepting = port.pause_accepting
      @conns = conns
      @table = conns.table # fd => Conn (its size, read without a call)
      @stopping = false
      @runner = runner
      @scoreboard = scoreboard
      @logger = logger
      @index = index
      @socket = socket if socket && config[:handoff_after].positive?
      @header_timeout = config[:header_timeout]
      @keepalive_timeout = config[:keepalive_timeout]
      @max_connections = config[:max_connections]
      @short_since = nil # when this worker first refused a moved connection for want of descriptors (#adopt)
      @retiring = false # stopping while the siblings serve on: idle connections move to them (#move_idle)
      @moved_in = 0
      @moved_out = 0 # a retiring worker's idle connections (#move_idle, #move_idle_later); @way counts its own
      @polled = false
      # Connections may wait on the hand-off socket without this worker having been woken for them:
      # it was not polled (#intake), or a wake-up found no room. Only then does a freed thread look
      # (#adopt_while_room), so a request costs no empty receive.
      @unseen = true
      # How this worker's waiting requests move, chosen once (the class comment).
      @way = if @socket && runner.size > 1
               LoopPasses.new(self, conns, runner, config, scoreboard, index, @socket[0].fileno)
             else
               LoopKeeps.new(runner, config, scoreboard)
             end
    end

    # listener_info: [env template, tcp] of each listener, for a connection moved here.
    def start(poller, listener_info)
      return unless @socket

      @poller = poller
      @way.start(poller, @socket[0].fileno, self)
      @fd = @socket[1].fileno
      @listener_info = listener_info
      intake(true)
    end

    # The worker exits: its moves are written (#stopping! has run, so nothing is taken in again, as #tick would not).
    def stop
      @way.stop
      report_moves
    end

    # paused: the worker accepts nothing (Worker#pause_accepting).
    def tick(paused)
      report_moves
      # short of descriptors (#short_of_descriptors): look at the hand-off socket again
      intake(true) if @short_since && !@stopping && !@runner.saturated? && !paused
    end

    def moved_out = @way.moved_out + @moved_out

    # The worker stops: it takes no moved connection to queue for its threads any more (#pass_on,
    # #adopt_while_room); what is left on the socket it still takes (#adopt_one, #take_left_over).
    def stopping!
      @stopping = true
    end

    # Every app thread has a request: no more from the hand-off socket. With the loop passing requests
    # on, new connections are still accepted (a request on one moves on at once, in arrival order
    # with the rest); without, they wait in the listen queue for a worker with a free thread: true
    # then, and the loop stops accepting (Worker#pause_accepting).
    def saturated = @way.saturated

    # May this worker take one more connection whose request waits (moved here, or queued for its
    # threads)? Below max_connections, and a thread free or (with hand-off) room in its queue: one
    # round at most, and only behind threads running a request younger than a typical one (at
    # woke_at, when the loop woke).
    def room?(woke_at) = @table.size < @max_connections && @way.room?(woke_at)

    # May it accept a new connection? With the loop passing requests on (app threads and hand-off),
    # below max_connections is enough: a request on it that finds no room moves on at once (#pass_on),
    # in arrival order with the rest. Otherwise only with #room?: they wait in the listen queue.
    def accept? = @table.size < @max_connections && @way.accept?

    # Whether the hand-off socket is in the poller (connections other workers moved are taken).
    def intake(on)
      return if @fd.nil? || @polled == on || (on && @retiring) # (#move_idle: what it moved is the siblings')

      on ? @poller.add(@fd, Native::Poller::EXCLUSIVE) : @poller.delete(@fd)
      @polled = on
      @unseen = true unless on
    end

    # The hand-off socket is readable: takes one connection if there is room. A wake-up with no
    # connection (a sibling that could not take one, or could not accept: #pass_wake) may stand for
    # connections waiting in a listen queue that woke only that sibling: true then, and the loop
    # looks at its listeners (Worker#accept_stranded).
    def adopt_one(woke_at)
      unless room?(woke_at)
        @unseen = true
        return false
      end
      adopt(woke_at).nil?
    end

    # This worker could not accept (EMFILE) the connections a listener woke it for (EPOLLEXCLUSIVE:
    # it alone was woken): a sibling is woken through the hand-off socket to take them (#adopt_one).
    def pass_wake
      Native::Conn.pass_wake(@socket[0].fileno) if @socket
    end

    # A thread is free again: requests moved to the hand-off socket have waited longest, so they take
    # the room first, as many as fit.
    def adopt_while_room(woke_at)
      return unless @fd && @unseen

      @unseen = false
      until @stopping || !room?(woke_at)
        return if adopt(woke_at).nil? # none left (or too few descriptors: #intake(false) marked it unseen again)
      end
      @unseen = true # more may wait than there was room for
    end

    # The worker retires while its siblings serve on (Worker#retire): each idle connection (nothing of
    # a next request read yet) moves to the hand-off socket, where a sibling takes it, and this worker
    # takes none back. One that cannot move (the socket's queue is full) drains here as before.
    # How many moved.
    def move_idle
      return 0 unless @socket

      @retiring = true # the socket is not watched again (#intake): not even once an app thread frees up
      intake(false)
      sender = @socket[0].fileno
      moved = 0
      @table.values.each do |conn|
        next unless conn.state == Connections::IDLE && conn.buffered.zero? && conn.pass_idle(sender)

        @conns.moved_away(conn)
        moved += 1
      end
      @moved_out += moved
      moved
    end

    # Every request queued for the threads moves on (to the hand-off socket, as far as it has room):
    # from #move_waiting, and at once when one of the threads is stuck past the timeout
    # (Worker#timed_out_in_thread). How many moved.
    def move_queued = @way.move_queued

    # A retiring worker's connection that becomes idle after the retirement began (its response,
    # which promised keep-alive, was on its way then): it moves as the idle ones did (#move_idle),
    # where its client's next request is answered. True when it did (it is gone here).
    def move_idle_later(conn)
      return false unless @retiring && conn.pass_idle(@socket[0].fileno)

      @moved_out += 1
      @conns.moved_away(conn)
      true
    end

    # A stopping worker with no connection left takes what is still on the hand-off socket, one per
    # call, so a connection moved just before the stop is served. True when it took one.
    def take_left_over(woke_at) = @fd && adopt(woke_at)

    # Every app thread is busy and a request may wait on this idle connection (the loop thread is about
    # to read it): one already on the hand-off socket waited longer and takes the queue's room first;
    # then, if there is no room, this one moves on. True when it did (the connection is gone here).
    # moved: it was just taken off the hand-off socket itself. woke_at: when the loop woke.
    def pass_on(conn, moved, woke_at) = @way.pass_on(conn, moved, woke_at)

    # LoopPasses#pass_on: a connection waiting on the hand-off socket is taken first, if there is room.
    def adopt_first(woke_at)
      adopt(woke_at) if !@stopping && room?(woke_at)
    end

    # A new connection (accepted or moved here) whose request would find no room moves on at once.
    def pass_new(conn, woke_at) = @way.pass_new(conn, woke_at)

    # Requests queued here for a thread (#room?) move on, their bytes with them, once the oldest has
    # waited handoff_after and another worker has a free thread, so none waits behind a slow request
    # while a worker is free; or once it has waited twice as long as a request typically runs (the
    # threads it waits for are held by slow ones): then to the hand-off socket, where every worker's
    # next free thread takes the oldest first. woke_at: when the loop woke (how long they waited).
    def move_waiting(woke_at) = @way.move_waiting(woke_at)

    # When the loop should look again at requests queued here (#move_waiting): the oldest may move
    # handoff_after after it was queued (then every handoff_after while it still waits). t otherwise.
    def next_look(t, woke_at) = @way.next_look(t, woke_at)

    # Connections the watcher moved to the hand-off socket while the app ran: another worker owns
    # them now. Each is unregistered (the socket lives on there, and epoll forgets a socket only
    # once every holder has closed it), its fd here closed and its Conn forgotten.
    def release_moved(fds)
      fds.each do |fd|
        conn = @conns[fd]
        next unless conn&.moved?

        @conns.moved_away(conn)
      end
    end

    private

    def report_moves
      @scoreboard.moves(@index, moved_out, @moved_in) if @fd
    end

    # A connection another worker moved here: served like a fresh one, whose request is waiting.
    # One per loop turn, so free workers share the queue. A worker short of descriptors takes none
    # (Conn.receive refuses, #short_of_descriptors): the kernel would drop the socket it has no
    # descriptor for, and its client would be reset. The send end goes along for the wake-up a
    # refusing worker passes on to the others.
    #
    # Every worker may be short at once (all of them within BB_RECEIVE_FD_RESERVE of their limit): a
    # connection still queued STRANDED_SECONDS after this worker first refused it has found no worker
    # with room, and this one takes it with the smaller reserve rather than leave it stranded there.
    # woke_at: when the loop woke (a moved connection's request arrived by then).
    def adopt(woke_at)
      last = false
      conn = begin
        Native::Conn.receive(@fd, @listener_info, @socket[0].fileno)
      rescue Errno::EMFILE, Errno::ENFILE
        raise unless @short_since && woke_at - @short_since >= STRANDED_SECONDS

        last = true
        Native::Conn.receive(@fd, @listener_info, @socket[0].fileno, true)
      end
      @short_since = nil if conn.nil? # none waits: the clock starts again with the next refusal
      return conn if conn.nil? || conn == false

      if @shortage&.on? && !last
        @short_since = nil
        @shortage.over { |n, secs| "hand-off: taking moved connections again (#{n} refused over #{secs} s)" }
      end
      @moved_in += 1
      # one that served requests is a keep-alive connection (a retiring worker's idle one, #move_idle)
      @conns.take(conn, conn.requests.positive? ? @keepalive_timeout : @header_timeout, woke_at, true)
      conn
    rescue Errno::EMFILE, Errno::ENFILE, Errno::ECONNABORTED => e
      short_of_descriptors(e, woke_at)
      e.is_a?(Errno::ECONNABORTED) ? false : nil # (false: one was taken off the socket, and lost)
    end

    # Too few descriptors to take a moved connection: Conn.receive left it queued for another worker
    # (EMFILE), or the kernel dropped it (ECONNABORTED: the table filled up after the check); both
    # counted in the scoreboard slot (blackbuck_handoff_failures_total). Logged once per episode.
    # Short of the reserve, this worker stops polling the hand-off socket (the others take what is
    # queued) and looks again every tick (#tick), taking what no worker with room took within
    # STRANDED_SECONDS (#adopt); it accepts new connections on (accept needs one descriptor, and
    # pauses by itself when there is none). Out of descriptors altogether (ECONNABORTED), it takes no
    # connection of either kind until it has room: Worker#resume_accepting tries every tick and
    # whenever one of its connections closes.
    def short_of_descriptors(err, woke_at)
      @short_since ||= woke_at
      aborted = err.is_a?(Errno::ECONNABORTED)
      (@shortage ||= Episode.new(@logger)).hit do
        fate = aborted ? "its client was reset" : "moved connections stay queued for the others"
        "hand-off: #{err.message}: #{fate}; this worker takes moved connections again once it has room, or " \
          "any still queued after #{STRANDED_SECONDS} s (open connections: #{@table.size})"
      end
      aborted ? @pause_accepting.call : intake(false)
    end

    # The two ways a worker's waiting requests move (the class comment), one chosen by #initialize.
    # Each answers the same calls, the part of Balancer's method of that name that depends on the way:
    #
    #   start(poller, send_fd, balancer), stop, moved_out   with a hand-off socket / the worker exits /
    #                                                       requests this way moved
    #   saturated                 every app thread has a request: what stops (true: accepting)
    #   room?(woke_at), accept?   below max_connections (Balancer checks it), may it take one more
    #                             connection whose request waits / a new connection?
    #   pass_on(conn, moved, woke_at), pass_new(conn, woke_at), move_queued, move_waiting(woke_at),
    #   next_look(t, woke_at)     the loop's own moves (LoopKeeps: none)
    #
    # Neither reaches the loop: woke_at comes with the calls, and what the loop is to do comes back.

    # App threads and a hand-off socket: the loop passes requests on itself (Conn#pass, #pass_request).
    class LoopPasses
      # balancer: the hand-off socket's receiving side (intake, adopt_first); conns: moved_away.
      def initialize(balancer, conns, runner, config, scoreboard, index, send_fd)
        @balancer = balancer
        @conns = conns
        @runner = runner
        @scoreboard = scoreboard
        @index = index
        @send_fd = send_fd
        @handoff_after = config[:handoff_after]
        @size = runner.size
        # A full round waits here, not fewer: a request moved to the hand-off socket queues behind the
        # other workers' too, and under an even load that made 1% wait a round longer (p99 61 ms against
        # 51 on the 10 ms app with 2 x 5 threads and 50 clients; a queue of 2 then).
        @queue_max = [@size, QUEUE_MIN].max
        @moved_out = 0
      end

      attr_reader :moved_out

      def start(_poller, _send_fd, _balancer) = nil
      def stop = nil

      # New connections are still accepted: a request on one that finds no room moves on at once.
      def saturated
        @balancer.intake(false)
        false
      end

      # A thread free or room in the queue: one round at most, and only behind threads running a
      # request younger than a typical one.
      def room?(woke_at) = !full?(woke_at)

      # Below max_connections is enough (#pass_new).
      def accept? = true

      def pass_on(conn, moved, woke_at)
        @balancer.adopt_first(woke_at) unless moved
        full?(woke_at) && move_out(conn)
      end

      def pass_new(conn, woke_at) = full?(woke_at) && move_out(conn)

      def move_queued
        moved = 0
        @runner.take_back do |conn|
          next false unless conn.pass_request(@send_fd)

          moved += 1
          @conns.moved_away(conn)
          true
        end
        @moved_out += moved
        moved
      end

      def move_waiting(woke_at)
        return unless @runner.busy > @size # (queued here)

        oldest = @runner.oldest_waiting
        return if oldest.nil? || (waited = woke_at - oldest) < @handoff_after
        return unless waited >= @handoff_after + @runner.typical * 2 || @scoreboard.free_elsewhere?(@index)

        move_queued
      end

      def next_look(t, woke_at)
        return t unless @runner.busy > @size && (oldest = @runner.oldest_waiting) # (queued here)

        [t, [oldest, woke_at].max + @handoff_after].min
      end

      private

      # Every thread busy and the queue holds a round already, or only threads held by slow requests.
      def full?(woke_at)
        busy = @runner.busy
        busy >= @size + @queue_max || (busy >= @size && !@runner.room?(woke_at))
      end

      # Every app thread is busy and a request waits on this idle connection: another worker serves
      # it (the hand-off socket; a worker takes from it only with a free thread). Not when part of it
      # was read already, or the hand-off queue is full: then it waits here for a thread.
      def move_out(conn)
        return false unless conn.pass(@send_fd)

        @moved_out += 1
        @conns.moved_away(conn)
        true
      end
    end

    # Every other worker: the loop moves no request; with one app thread and a hand-off socket, the
    # watcher thread does while the app runs (#start).
    class LoopKeeps
      def initialize(runner, config, scoreboard)
        @runner = runner
        @handoff_after = config[:handoff_after]
        @scoreboard = scoreboard
        @watcher = nil # Native::Handoff, with one app thread and a hand-off socket
      end

      # With a hand-off socket (so one app thread: LoopPasses otherwise): the app holds the loop while
      # it runs, so the watcher moves what waits meanwhile; the runner gives it request_start and
      # request_done and hands the balancer what it moved (#release_moved).
      def start(poller, send_fd, balancer)
        @watcher = Native::Handoff.new(poller, send_fd, @handoff_after, @scoreboard)
        @runner.handoff(@watcher, balancer)
        @watcher.start
      end

      def stop = @watcher&.stop
      def moved_out = @watcher ? @watcher.moved_out : 0

      # New connections wait in the listen queue for a worker with a free thread: the loop stops
      # accepting (true).
      def saturated = true

      # A free thread (always, with one app thread: the loop runs only between requests).
      def room?(_woke_at) = !@runner.saturated?
      def accept? = !@runner.saturated? # (room?)

      def pass_on(_conn, _moved, _woke_at) = false
      def pass_new(_conn, _woke_at) = false
      def move_queued = 0
      def move_waiting(_woke_at) = nil
      def next_look(t, _woke_at) = t
    end
  end
end
