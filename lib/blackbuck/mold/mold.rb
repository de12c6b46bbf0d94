# frozen_string_literal: true

require "socket"
require_relative "../warmup"
require_relative "action_cable_refork"
require_relative "../messages"

module Blackbuck
  # The app says it can no longer be forked safely (it started a thread, opened a connection that
  # cannot be shared, ...): a worker told to fork the mold refuses, and reforking stops (refork_after).
  # why: what the log says.
  def self.no_longer_fork_safe!(why = "Blackbuck.no_longer_fork_safe! was called")
    @fork_unsafe = why.to_s
  end

  # Why this process must not be forked again, or nil.
  def self.fork_unsafe_reason = @fork_unsafe

  # The mold (refork_after): a worker that served long enough to have its app warm (code loaded,
  # caches filled, YJIT's code compiled) stops serving and forks the process new workers fork
  # from (Forker#mold_from_worker), so they start with what it warmed shared copy-on-write instead of
  # each warming a private copy. It forks rather than becomes it: the sockets the app took over
  # (WebSockets) and the app's threads serving them stay the worker's, which exits once the mold
  # is there (as any retiring worker, closing them); the mold closes its copies (Hijacked) and has
  # no thread but its own. It runs only this loop: it announces itself to the master (Refork) with a
  # socket of its own (Messages::MoldReady), then forks one worker per Messages::SpawnRequest the
  # master sends (with the worker's control pipe), and answers Messages::Spawned. Each worker is
  # forked twice over (Forker#worker_from_mold: the middle process exits at once), so it becomes the
  # master's child (the master is a child subreaper) and the master reaps it, as it reaps the
  # workers it forks itself.
  # It ends when the master closes its socket or sends TERM. When it is gone a serving worker forks
  # the next, or, when none can, a new one boots the app (a master that holds the app forks the
  # workers itself instead): Refork, docs/REFORKING.md.
  class Mold
    READY_SECONDS = 30 # the worker waits this long for the mold it forked to announce itself, then exits

    # In a worker told to fork the mold whose app must not be forked (Blackbuck.no_longer_fork_safe!):
    # the master hears why, and turns reforking off.
    # pid: the worker (a mold whose after_refork raised names the worker that forked it).
    def self.refuse(line, why, pid: Process.pid)
      Messages.send_datagram(line, Messages::Unsafe.new(pid, why)) if line
    rescue IOError, SystemCallError
      nil
    end

    # forker: forks the workers (Forker#worker_from_mold); line: the master's announcement socket
    # (Refork#line); server: what the hooks get (the Supervisor, as in the master).
    # index: the slot it served as a worker (for the log), nil for the mold that booted the app
    # itself (Forker#booting_mold: the master does not load it when reforking). ready: in a mold a
    # worker forked (Forker#mold_from_worker), the pipe it closes once it has announced itself (the
    # worker then exits); closed: how many of the worker's taken-over sockets it closed (Hijacked).
    def initialize(forker:, line:, config:, logger:, server:, index:, ready: nil, closed: nil)
      @forker = forker
      @line = line
      @config = config
      @logger = logger
      @server = server
      @index = index
      @ready = ready
      @closed = closed
    end

    # Never returns: the process exits when the mold's life ends.
    def run
      %i[TERM INT QUIT].each { |sig| trap(sig) { exit!(0) } }
      %i[USR1 USR2 URG HUP TTIN TTOU].each { |sig| trap(sig, "IGNORE") }
      trap(:CHLD, "DEFAULT")
      $0 = @index ? "blackbuck mold (was worker #{@index})" : "blackbuck mold (booted the app)"
      forgotten = forget_the_workers_state if @ready
      prepared = prepare_heap
      @socket, theirs = Socket.pair(:UNIX, :SEQPACKET)
      from = [Process.ppid, @index] if @ready # the worker that forked it (it may be reaped already when the master reads this)
      Messages.send_datagram(@line, Messages::MoldReady.new(Process.pid, theirs, *from))
      theirs.close
      @logger.info("mold (pid #{Process.pid}) ready#{forgotten}#{prepared}" \
                   "#{"; closed its copies of #{@closed} connections the app took over (they stay the worker's)" if @closed&.positive?}")
      @ready&.close # the worker that forked it may exit now
      serve
      exit!(0)
    rescue Exception => e # rubocop:disable Lint/RescueException -- the mold must never fall back into a worker's code
      @logger.exception("mold (pid #{Process.pid}) failed", e)
      exit!(1)
    end

    private

    # In a mold a worker forked: what the worker started that its threads ran is dropped before any
    # worker is forked (the threads did not come along): Action Cable's server parts
    # (ActionCableRefork), then the app's own after_refork. An after_refork that raises ends this
    # mold and reforking (as Blackbuck.no_longer_fork_safe! does): the master says why, and its
    # workers go on forking from the mold they had. Returns the part of the ready line that says so.
    def forget_the_workers_state
      cable = ActionCableRefork.reset
      begin
        @config[:after_refork]&.call(@server)
      rescue StandardError => e
        Mold.refuse(@line, "after_refork raised #{e.class}: #{e.message.lines.first&.chomp}", pid: Process.ppid)
        raise
      end
      "#{'; Action Cable reset' if cable}#{'; after_refork run' if @config[:after_refork]}"
    end

    # Warm pages are shared only if they stay unwritten: the GC step (gc_before_fork) makes the
    # survivors old first, as the master does before its first fork, but does not compact: moving
    # every object would write every heap page, and the pages the mold still shares with the master
    # (and the master with nobody else, once every worker is the mold's) would turn private on both
    # sides. Measured on the bench's Rails app (refork_after 50, 100, 1000; 4 workers): the master's
    # USS 71-74 MiB with the mold compacting, 43-53 without; total PSS 313-325 against 298-302 MiB.
    # The mold that booted the app shares nothing yet (the master holds no app): it compacts, as a
    # master that boots the app does.
    # The mold serves no request: the database connections it held as a worker would idle for ever
    # (and its workers would inherit them), so Active Record lets them go.
    def prepare_heap
      Warmup.disconnect_active_record
      return "" unless @config[:gc_before_fork]

      ", heap prepared in #{format('%.2f', Warmup.prepare_heap(logger: @logger, compact: @index.nil?))} s"
    end

    def serve
      loop do
        case (message = Messages.receive(@socket))
        when nil then return # the master closed its end: it is gone, or done with this mold
        when Messages::SpawnRequest
          spawn(message.index, message.control)
          message.control.close
        else @logger.warn("mold (pid #{Process.pid}): not a request, ignored: #{message.inspect}")
        end
      end
    end

    # One worker for slot index (Forker#worker_from_mold: it is the master's child, and the master
    # hears its pid from it); a fork that fails is answered so.
    def spawn(index, control)
      @config[:before_fork]&.call(@server, index)
      @forker.worker_from_mold(index, control, @socket)
    rescue StandardError => e
      @logger.exception("mold (pid #{Process.pid}): forking worker #{index} failed", e)
      Messages.send_datagram(@socket, Messages::SpawnFailed.new(index, "#{e.class}: #{e.message}"))
    end
  end
end
