# frozen_string_literal: true

require_relative "../messages"
require_relative "status"
require_relative "status_snapshot"
require_relative "request_counts"
require_relative "systemd_notify"
require_relative "signal_queue"
require_relative "children"
require_relative "../forker"
require_relative "respawn"
require_relative "worker_exits"
require_relative "request_timeouts"
require_relative "reload"
require_relative "refork"
require_relative "../app_source"
require_relative "jobs"
require_relative "restart_file"

module Blackbuck
  # The master process: forks workers from the preloaded app, keeps their number, replaces
  # the dead and the stuck, and turns signals into actions. Traps only enqueue and wake the
  # loop; #run's `case` is the whole lifecycle (docs/SIGNALS.md follows it branch for branch).
  # Each job it delegates has a room of its own: the signal queue (SignalQueue), the workers
  # and their reaping (Children), forking one (Forker), when to replace one (Respawn), the
  # request timeout (RequestTimeouts), HUP and the handover (Reload), the app's job runner (Jobs),
  # the restart file (RestartFile).
  class Supervisor
    SIGNALS = %i[TERM INT QUIT HUP TTIN TTOU USR1 CHLD].freeze
    FORCE_GRACE = 5 # seconds a forced stop (a second INT/TERM) gives a request already in the app

    # old_workers: pid => control IO (nil once told to stop), from previous images (HUP).
    # source: the AppSource, the app preloaded here or booted by a mold (reforking, Refork).
    def initialize(config:, source:, listeners:, logger:, old_workers: [], notify: nil)
      @config = config
      @listeners = listeners
      @logger = logger
      @wanted = config[:workers]
      @stopping = false
      @scoreboard = Native::Scoreboard.new([@wanted * 4, 64].max.clamp(1, 4096))
      @request_counts = RequestCounts.new(@scoreboard)
      @signals = SignalQueue.new(SIGNALS)
      @children = Children.new(@scoreboard, logger, old_workers)
      @refork = Refork.new(config[:refork_after], children: @children, scoreboard: @scoreboard, logger: logger)
      # no mold can be made here: the master holds the app after all
      source.load_in_master(logger) if source.mold_boots? && !@refork.on?
      @source = source
      @forker = Forker.new(server: self, config: config, source: source, listeners: listeners, scoreboard: @scoreboard,
                           logger: logger, traps: SIGNALS, refork: @refork)
      @respawn = Respawn.new(logger)
      @exits = WorkerExits.new(@scoreboard)
      @timeouts = RequestTimeouts.new(config[:timeout], @scoreboard, logger)
      @jobs = (Jobs.new(config, logger) if config[:solid_queue])
      @restart_file = (RestartFile.new(config[:restart_file]) if config[:restart_file])
      @reload = Reload.new(server: self, config: config, logger: logger, notify: notify, children: @children,
                           listeners: listeners, signals: @signals, jobs: @jobs, restart_file: @restart_file,
                           refork: @refork)
      @notify = notify       # SystemdNotify under a Type=notify unit, else nil
      @announced = false     # READY=1 said for the current set of workers
      @drain_until = nil     # shutdown_delay: when TERM's delay is over
      @exit_status = 0       # 1 once the workers cannot boot
    end

    # Serving, as GET /ready tells a load balancer or Kubernetes: not from the moment a stop
    # (or TERM's shutdown_delay) begins.
    # And only once a worker serves: a balancer that sends clients to a host whose workers are still
    # booting makes them wait in the listen queue.
    def ready? = !@stopping && @drain_until.nil? && serving?

    # A worker has taken its scoreboard slot (it is in its loop), or the previous image's workers
    # still serve (a HUP re-exec).
    def serving? = @children.serving?

    # A graceful stop, as TERM: safe from a signal trap or another thread (Server::Control#stop).
    def stop = @signals.push(:TERM)

    attr_reader :children, :request_counts, :refork

    def run
      kept = Reexec.status_listener # a HUP re-exec's
      if @config[:stats_listen]
        snapshot = StatusSnapshot.new(children: @children, request_counts: @request_counts, scoreboard: @scoreboard,
                                      listeners: @listeners, refork: @refork, exits: @exits)
        @status = StatusServer.start(@config[:stats_listen], supervisor: self, snapshot: snapshot,
                                                             logger: @logger, inherited: kept)
      else
        kept&.close
      end
      @reload.end_standin
      @signals.trap_all
      early = EarlySignals.take # a re-exec's: those that arrived while the new code booted
      unless early.empty?
        @logger.info("signals received while this image booted, handled now: #{early.join(' ')}")
        early.each { |sig| @signals.push(sig) }
      end
      $0 = "blackbuck master #{@listeners.map(&:name).join(' ')}"
      @source.prepare_heap(@logger) # last thing before the first fork (a master without the app: nothing)
      turn until @stopping
      shutdown
    end

    private

    # One turn of the master's loop: a queued signal, or the housekeeping. No exception here ends
    # the master (the workers keep serving): it is logged and the loop goes on.
    def turn
      case (sig = @signals.shift)
      when nil
        reap
        @timeouts.check(@children)
        # (first: a mold that has just announced itself forks the missing workers in this turn)
        @refork.turn(@wanted, quiet: @stopping || @drain_until || @children.handing_over? || @reload.pending?)
        why = @refork.take_boot_failure
        cannot_boot(why) if why
        spawn_missing
        @reload.retire_old_workers(@wanted)
        reload if @reload.pending? && !@children.handing_over?
        @request_counts.sample(@children.live_slots)
        @jobs&.turn(stopping: @stopping || @drain_until)
        restart_file_touched
        announce
        @stopping = true if @drain_until && now >= @drain_until
        sleep_until_woken(@notify&.watchdog_interval&.clamp(0.01, 1) || 1)
      else
        on_signal(sig)
      end
    rescue StandardError => e
      @logger.exception("master: #{sig || 'loop'} failed; still serving", e)
      sleep_until_woken(0.1) unless sig # a fault that repeats does not spin
    end

    def on_signal(sig)
      case sig
      when :TERM, :INT, :QUIT
        if sig == :TERM && @config[:shutdown_delay].positive? && @drain_until.nil?
          drain
        else
          again = sig == :QUIT ? "QUIT again exits at once" : "#{sig} again forces the stop, a third time exits at once"
          @logger.info("#{sig}: stopping gracefully (up to #{@config[:graceful_timeout]}s); #{again}")
          @stopping = true
        end
      when :HUP
        reload # (the mold stays until the new code has passed its check: Reload#hup)
      when :TTIN
        @wanted += 1 if @wanted < @scoreboard.size
        @logger.info("TTIN: workers = #{@wanted}")
        @announced = false
      when :TTOU
        @wanted -= 1 if @wanted > 1
        @logger.info("TTOU: workers = #{@wanted}")
        @announced = false
        # the others serve on: it retires (its idle connections move to them)
        @children.each do |c|
          next if c.index < @wanted

          @exits.retiring(c.pid)
          @children.tell_stop(c, Messages::RETIRE)
        end
      when :USR1
        reopen_log
        @children.signal_all(:USR1) # old ones still write to it too
      when :CHLD
        reap
      else
        raise "[BUG] unexpected signal #{sig}"
      end
    end

    # `bin/rails restart` touched the restart file: what HUP does, through the HUP branch.
    def restart_file_touched
      return unless @restart_file&.touched? && !@stopping && !@drain_until

      @logger.info("#{@restart_file.path} changed: restarting as HUP does")
      @signals.push(:HUP)
    end

    # USR1 (logrotate moved the file): opens the log file again and says so in the new one.
    def reopen_log
      @logger.reopen
      @logger.info(@config[:log] ? "USR1: reopened log file #{@config[:log]}" : "USR1: no log file to reopen (logging to stderr)")
    end

    # shutdown_delay: the first TERM makes GET /ready answer 503 at once, so the load balancer or
    # Kubernetes stops sending new clients, while everything keeps serving for shutdown_delay
    # seconds; then the graceful stop begins. Another TERM, INT or QUIT begins it at once.
    def drain
      @drain_until = now + @config[:shutdown_delay]
      @logger.info("TERM: not ready (GET /ready answers 503); serving #{@config[:shutdown_delay]}s more " \
                   "(shutdown_delay), then stopping gracefully")
      @notify&.stopping("draining for #{@config[:shutdown_delay]}s, then stopping")
    end

    # Once per set of workers (at start, after TTIN/TTOU, in a new image after HUP): systemd hears
    # READY=1 when every wanted worker runs, and the watchdog hears the loop turn.
    def announce
      return unless @notify

      announce_watchdog
      return if @announced || !@children.all_started?(@wanted)

      @announced = true
      @notify.ready("#{Logger.count(@children.size, 'worker')}, pid #{Process.pid}")
    end

    # The watchdog keeps hearing from the loop while a HUP's boot check blocks it.
    def announce_watchdog
      return unless @notify&.watchdog_interval && now >= (@watchdog_at ||= 0)

      @watchdog_at = now + @notify.watchdog_interval
      @notify.watchdog
    end

    # Up to seconds, or until a signal wakes the loop; status connections are served meanwhile
    # (never waited for), and the sleep ends by their next deadline so it is kept.
    def sleep_until_woken(seconds = 1)
      status = @status
      seconds = [seconds, status.timeout].compact.min if status
      readable, writable = IO.select([@signals.wake_io, *@refork.readers, *status&.readers], status&.writers, nil, seconds)
      @signals.clear_wake
      status&.serve(readable || [], writable || [])
    end

    # A slot the mold was asked to fill waits for its answer (Refork#listen), never here.
    def spawn_missing
      @respawn.note_ready(@children)
      taken = @children.map(&:index)
      (0...@wanted).each do |i|
        next if taken.include?(i) || @refork.asked?(i)
        return if @respawn.wait?
        next if @refork.ask(i)
        return boot_mold if @source.mold_boots?

        @children.add(@forker.worker(i) { close_in_worker })
      end
    end

    # The master does not hold the app and there is no mold to fork from: one boots it (Refork).
    def boot_mold
      return if @stopping || !@refork.boot_due?

      @refork.booting(@forker.booting_mold { close_in_worker })
    end

    # The first mold could not boot the app: the server stops, exit status 1, as when the workers
    # cannot boot.
    def cannot_boot(why)
      @logger.error("cannot boot the app: #{why}; stopping")
      @exit_status = 1
      @stopping = true
    end

    # First thing in a new worker: what the master holds that a worker must not.
    def close_in_worker
      @signals.close_in_child
      @status&.close_in_child
      @children.close_in_child
      @refork.close_in_child
    end

    # Every worker that has exited: its numbers kept, its exit logged (and, for one that could not
    # boot, maybe the end of the master: Respawn), its hook called.
    def reap
      reasons = {} # pid => why, of a child the refork says only then was a worker (Refork#reaped)
      others = lambda do |pid, status, mold|
        next if @jobs&.reaped(pid, status)

        @refork.reaped(pid, status, mold, reasons[pid] = @forker.crash_reason(pid))
      end
      @children.reap(others: others) do |child, status|
        @request_counts.worker_exited(child.index, child.pid) # before spawn_missing lets a new worker reset the slot
        @refork.worker_exited(child)
        @exits.exited(child, status, timed_out: @timeouts.noticed?(child.pid)) unless @stopping # (the slot too)
        why = reasons.delete(child.pid) || @forker.crash_reason(child.pid)
        if @respawn.exited(child, status, started: @children.started?(child), stopping: @stopping,
                                          handing_over: @children.handing_over?, why: why)
          @exit_status = 1
          @stopping = true
        end
        @config[:after_worker_exit]&.call(self, child.index, status)
      end
    end

    # HUP (Reload): the loop keeps its watchdog fed, its status listener answered and the mold heard
    # (Refork#listen) while the new code boots.
    def reload
      @reload.hup(@status) do |wait|
        announce_watchdog
        @refork.listen
        sleep_until_woken(wait)
      end
    end

    # Stop accepting at once (the listening sockets close here and in every worker), let the
    # workers finish what is in flight, then kill whatever is left after graceful_timeout. Stop
    # signals keep counting meanwhile: a second INT or TERM forces the stop (workers close every
    # connection and exit once the request they run is answered, at most FORCE_GRACE seconds), a
    # third one, or a QUIT, kills the workers and exits at once.
    def shutdown
      @listeners.each(&:close)
      @notify&.stopping("stopping gracefully (up to #{@config[:graceful_timeout]}s)")
      @refork.listen # the workers the mold has forked stop with the others
      @refork.stop_mold("the server stops")
      @jobs&.stop("the server stops")
      @children.tell_all
      @children.stop_old # after a HUP not yet complete: they stop too
      # A worker whose app runs reads its pipe only after the request: this makes it close its
      # listeners now, so new connections are refused instead of queued (Worker#stop_accepting_in_app).
      @children.signal_all(Messages::STOP_ACCEPTING_SIGNAL)
      stops = 1
      deadline = now + @config[:graceful_timeout] + 1
      until all_gone?
        case (sig = @signals.shift)
        when nil
          reap
          @jobs&.turn(stopping: true) # KILLs a runner past graceful_timeout
          break if now > deadline

          announce_watchdog
          sleep_until_woken(0.05) # GET /ready keeps answering 503 meanwhile
        when :TERM, :INT, :QUIT
          stops += 1
          return exit_at_once(sig) if sig == :QUIT || stops > 2

          @logger.info("#{sig} again: forcing the stop: workers close every connection and exit after the request " \
                       "they are running (at most #{FORCE_GRACE}s); #{sig} once more exits at once")
          @children.tell_all(Messages::FORCE)
          deadline = [deadline, now + FORCE_GRACE].min
        when :USR1 then reopen_log
        when :CHLD then reap
        else @logger.info("#{sig} ignored: the server is stopping")
        end
      end
      kill_workers(stops > 1 ? "still running after the forced stop" : "still running after graceful_timeout")
      @logger.info("master (pid #{Process.pid}) exiting")
      @exit_status
    ensure
      @status&.close
    end

    def exit_at_once(sig)
      @logger.warn("#{sig}: exiting at once")
      kill_workers("still running")
      @logger.info("master (pid #{Process.pid}) exiting")
      @exit_status
    end

    # No worker, and no job runner, is left.
    def all_gone? = @children.all_gone? && (@jobs.nil? || @jobs.gone?)

    def kill_workers(why)
      @jobs&.kill_all
      @children.pids.each do |pid|
        @logger.warn("worker pid #{pid} #{why}; killing it")
        @children.signal(:KILL, pid)
      end
      wait_until = now + 5 # SIGKILL cannot be caught: they are gone within moments
      until all_gone? || now > wait_until
        reap
        sleep 0.01
      end
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
