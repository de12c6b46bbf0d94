# frozen_string_literal: true

require "json"
require "socket"
require_relative "status_snapshot"
require_relative "status_metrics"

module Blackbuck
  # The status listener (--stats-listen ADDR), served by the master from its own loop:
  #   GET /status   JSON: every worker's scoreboard slot, listen-queue depths, totals (StatusSnapshot)
  #   GET /metrics  the same numbers in Prometheus text format (StatusMetrics)
  #   GET /ready, GET /live  probes (below)
  # The master never waits for a status client: it selects on #readers and #writers (with no
  # longer a timeout than #timeout) and calls #serve, which accepts what is pending, reads and
  # writes non-blocking, answers each connection once its request head is complete and closes
  # it after that one answer. Each connection has its own buffer and deadline, so idle or slow
  # clients cost a descriptor each, never the loop's time: a probe on a fresh connection is
  # answered at the loop's next turn however many are open (at most MAX_CLIENTS).
  # Every answer carries MARK, so `blackbuck status` can tell this listener from an app.
  class StatusServer
    READ_DEADLINE = 2.0       # seconds from accept a status client gets to send its whole request head
    WRITE_DEADLINE = 2.0      # seconds from its request a status client gets to take the whole answer
    MAX_CLIENTS = 1024        # status connections open at once; one more closes the oldest still sending its request
    ACCEPT_PER_SERVE = 256    # connections accepted per #serve, so one turn of the master's loop stays short
    ACCEPT_PAUSE = 0.1        # seconds the listener rests when accept finds no free descriptor (EMFILE)
    BACKLOG = 1024            # connections the kernel queues for the listener between two turns of the loop
    MAX_REQUEST_BYTES = 4096  # a longer request head is refused (the status page takes no input)
    LOCAL_HOST = "127.0.0.1"  # the host of an address that names none (PORT, :PORT): not reachable from outside
    MARK = "blackbuck-status" # response header only this listener sends; its value is FORMAT
    FORMAT = 1                # version of the /status JSON

    # At boot, the status listener's address cannot be bound: a boot error that says it is the status
    # listener's, and where its address was set (origin: "stats_listen in FILE", "--stats-listen";
    # the CLI knows which and calls #with_origin).
    class ListenError < ConfigError
      attr_reader :reason

      def initialize(reason = nil, origin = "stats_listen")
        @reason = reason
        super("status listener (#{origin}): #{reason}")
      end

      def with_origin(origin) = self.class.new(reason, origin)
    end

    # One status connection: the request head read so far, the answer not yet taken (nil while
    # the head is incomplete) and the monotonic time it is closed at if not done by then.
    Client = Struct.new(:io, :head, :out, :deadline)

    attr_reader :listener

    # Binds addr (a bare port on LOCAL_HOST) and returns the server; the caller selects on
    # #readers and #writers. The listener takes connections at once (no TCP_DEFER_ACCEPT): an
    # idle one is held, and bounded, here rather than in the kernel's queue where it would
    # crowd out probes.
    # inherited: the listener a HUP re-exec handed over (Reexec.status_listener), kept when it is
    # still the one addr names, so probes are queued across a reload, never refused.
    # snapshot: the StatusSnapshot its pages show.
    def self.start(addr, supervisor:, snapshot:, logger:, backlog: BACKLOG, inherited: nil)
      listener = inherited if inherited && same_address?(inherited, addr)
      unless listener
        begin
          listener = Listeners.bind(addr, backlog: backlog, bare_host: LOCAL_HOST)
          inherited&.close
        rescue ConfigError => e
          raise ListenError, e.message unless inherited # at boot: the error; after a HUP: the old address keeps serving

          logger.warn("HUP: status listener: #{e.message}; keeping #{inherited.name}")
          listener = inherited
        end
      end
      Native.defer_accept(listener.fd, 0) if listener.tcp?
      listener.io.fcntl(Fcntl::F_SETFL, listener.io.fcntl(Fcntl::F_GETFL) | Fcntl::O_NONBLOCK)
      logger.info("status listening on #{listener.name}#{' (kept across the reload)' if listener.equal?(inherited)}")
      new(listener: listener, supervisor: supervisor, snapshot: snapshot)
    end

    def self.same_address?(listener, addr)
      Listeners.names?(addr, listener.io.local_address, bare_host: LOCAL_HOST)
    rescue SystemCallError
      false
    end

    # supervisor: asked whether the server is ready (GET /ready) and serving.
    def initialize(listener:, supervisor:, snapshot:)
      @listener = listener
      @supervisor = supervisor
      @snapshot = snapshot
      @clients = {} # io => Client, oldest first
      @accept_paused_until = nil
    end

    def io = @listener.io

    # Master: what to select for reading (the listener, unless it rests, and every connection
    # whose request head is incomplete) and for writing (every connection with an answer to take).
    def readers
      ios = @clients.each_value.filter_map { |c| c.io if c.out.nil? }
      @accept_paused_until || @stopped ? ios : ios << io
    end

    def writers = @clients.each_value.filter_map { |c| c.io if c.out }

    # Master: seconds until the next deadline (a connection to close, the listener's rest to
    # end); nil when there is none.
    def timeout
      nearest = [@clients.each_value.min_by(&:deadline)&.deadline, @accept_paused_until].compact.min
      nearest && [nearest - now, 0].max
    end

    # Master, after its select: reads, answers and writes what is ready, accepts what is pending
    # and closes connections past their deadline. Never waits; call it after every select, also
    # one that timed out.
    def serve(readable, writable)
      readable.each do |ready|
        if (c = @clients[ready]) then receive(c)
        elsif ready == io then accept
        end
      end
      writable.each { |ready| (c = @clients[ready]) && take_answer(c) }
      expire
    end

    # A reloading master's stand-in, once the new image serves the listener: no new connection;
    # those it has are answered (or time out), then #done?. Safe in a signal trap.
    def stop_accepting
      @stopped = true
    end

    def done? = @stopped && @clients.empty?

    # Master: on shutdown (removes a UNIX socket file it created).
    def close
      drop_all
      @listener.close
    end

    # Worker, right after fork: drop the descriptors (listener and connections) without touching
    # the socket file or the master's connections.
    def close_in_child
      drop_all
      io.close unless io.closed?
    end

    private

    # At most ACCEPT_PER_SERVE pending connections; each is read at once (a probe's request is
    # usually there already). Out of descriptors, the oldest connection makes room; with none to
    # close, the listener rests ACCEPT_PAUSE (it stays readable, and selecting on it would spin).
    def accept
      ACCEPT_PER_SERVE.times do
        sock, = io.accept_nonblock(exception: false)
        return if sock == :wait_readable

        make_room if @clients.size >= MAX_CLIENTS
        c = Client.new(sock, String.new, nil, now + READ_DEADLINE)
        @clients[sock] = c
        receive(c)
      rescue Errno::ECONNABORTED, Errno::EPROTO, Errno::EINTR
        next # that client is gone; take the next
      rescue Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM
        next if make_room

        @accept_paused_until = now + ACCEPT_PAUSE
        return
      end
    end

    # Closes the oldest connection still sending its request (else the oldest): a new client, a
    # probe, always gets in, and a flood of idle connections only displaces itself. nil when
    # there is none.
    def make_room
      victim = @clients.each_value.find { |c| c.out.nil? } || @clients.each_value.first
      drop(victim) if victim
    end

    # Reads what the client sent; once the head is complete (or the client ended its side),
    # answers. A head past MAX_REQUEST_BYTES is refused: the connection closes unanswered.
    def receive(c)
      loop do
        chunk = c.io.read_nonblock(MAX_REQUEST_BYTES, exception: false)
        case chunk
        when :wait_readable then return
        when nil then return answer(c) # EOF: answer what we have
        end
        c.head << chunk
        return answer(c) if c.head.include?("\r\n\r\n") || c.head.include?("\n\n")
        return drop(c) if c.head.bytesize > MAX_REQUEST_BYTES
      end
    rescue IOError, SystemCallError
      drop(c)
    end

    def answer(c)
      line = c.head[/\A[^\r\n]+/]
      return drop(c) unless line

      c.out = answer_to(line)
      c.deadline = now + WRITE_DEADLINE
      take_answer(c)
    end

    # What the kernel takes of the answer now; the connection closes once it has all of it.
    def take_answer(c)
      n = c.io.write_nonblock(c.out, exception: false)
      return if n == :wait_writable

      c.out = c.out.byteslice(n..)
      drop(c) if c.out.empty?
    rescue IOError, SystemCallError
      drop(c)
    end

    def expire
      t = now
      @clients.each_value.select { |c| c.deadline <= t }.each { |c| drop(c) }
      @accept_paused_until = nil if @accept_paused_until && t >= @accept_paused_until
    end

    def drop(c)
      @clients.delete(c.io)
      c.io.close unless c.io.closed?
      c
    rescue IOError, SystemCallError
      c
    end

    def drop_all
      @clients.each_value { |c| c.io.close unless c.io.closed? }
      @clients.clear
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # The whole answer to a request line.
    def answer_to(line)
      method, target = line.split(" ", 3)
      path = target.to_s.split("?", 2).first
      head = method == "HEAD"
      if method != "GET" && method != "HEAD"
        response(405, "text/plain", "method not allowed\n", head: false)
      elsif path == "/status"
        response(200, "application/json", "#{JSON.generate(@snapshot.take)}\n", head: head)
      elsif path == "/metrics"
        snap = @snapshot.take
        response(200, "text/plain; version=0.0.4; charset=utf-8", StatusMetrics.text(snap, @snapshot.histograms(snap)),
                 head: head)
      elsif path == "/ready" # readiness: 503 until a worker serves, and from the moment a stop (or TERM's shutdown_delay) begins
        ready = @supervisor.ready?
        why = @supervisor.serving? ? "stopping\n" : "starting\n"
        response(ready ? 200 : 503, "text/plain", ready ? "ready\n" : why, head: head)
      elsif path == "/live" # liveness: the master's loop answers this itself, so an answer means it turns
        response(200, "text/plain", "live\n", head: head)
      else
        response(404, "text/plain", "not found\n", head: head)
      end
    end

    REASONS = { 200 => "OK", 404 => "Not Found", 405 => "Method Not Allowed", 503 => "Service Unavailable" }.freeze

    def response(code, type, body, head:)
      "HTTP/1.1 #{code} #{REASONS[code]}\r\ncontent-type: #{type}\r\ncontent-length: #{body.bytesize}\r\n" \
        "#{MARK}: #{FORMAT}\r\nconnection: close\r\n\r\n#{body unless head}"
    end
  end
end
