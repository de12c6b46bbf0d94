# frozen_string_literal: true

require_relative "reexec"
require_relative "../forker"

module Blackbuck
  # HUP, in the master: boot the new code in a separate process first; only if it boots, re-exec
  # this master with it (Reexec), its workers and listeners handed over. Started another way
  # (rackup), HUP replaces the workers. In the new image, the handover ends here too: the old
  # image's status stand-in is ended (#end_standin), and the old workers are told to finish once
  # every new one serves (#retire_old_workers).
  class Reload
    # server: what before_exec gets (the Supervisor); signals: the master's SignalQueue (what is
    # queued goes with the re-exec; its traps come back if the exec fails).
    # jobs: the app's job runner (Jobs) or nil; restart_file: the RestartFile or nil (both hand
    # something to the new image); refork: the master's Refork or nil (its mold stays until the new
    # code has passed its check).
    def initialize(server:, config:, logger:, notify:, children:, listeners:, signals:, jobs: nil, restart_file: nil,
                   refork: nil)
      @jobs = jobs
      @refork = refork
      @restart_file = restart_file
      @server = server
      @config = config
      @logger = logger
      @notify = notify
      @children = children
      @listeners = listeners
      @signals = signals
      @pending = false # a HUP came while the previous one's new workers were still starting
    end

    def pending? = @pending

    # HUP. A HUP while the previous one's new workers are still starting waits for them (HUPs that
    # arrive meanwhile make one reload: the loop calls again once #pending? and no longer handing
    # over); old workers already told to stop are handed to the next image to reap, however many
    # reloads ago they were started. status: the StatusServer, or nil. The block is called with the
    # seconds to wait while the new code boots (the master keeps its watchdog fed and its status
    # listener answered meanwhile). Returns only when there is no re-exec (or it failed).
    def hup(status, &wait)
      unless Reexec.available?
        @logger.info("HUP: replacing every worker (started without the blackbuck command: no code reload)")
        stop_mold("HUP: the workers fork from the master")
        @children.tell_all
        @jobs&.stop("HUP")
        @jobs&.resume # bin/jobs loads the app afresh: the new code's
        return
      end
      if @children.handing_over?
        @logger.info("HUP: the previous reload's new workers are still starting; reloading once they serve") \
          unless @pending
        @pending = true
        return
      end
      @pending = false
      @logger.info("HUP: checking that the new code boots")
      @notify&.reloading
      if (error = Reexec.check(&wait))
        @logger.error("HUP: the new code does not boot; the running workers keep serving: #{error}")
        @notify&.ready("reload failed, #{Logger.count(@children.size, 'worker')} still serving the old code")
        return
      end
      if @signals.queued?(%i[TERM INT QUIT])
        @logger.info("HUP: a stop was asked while the new code booted; stopping instead of re-executing")
        return
      end
      @logger.info("HUP: re-executing the master (pid #{Process.pid}) with the new code")
      stop_mold("HUP: the new code boots; its workers fork from #{@refork&.lean? ? 'a mold that boots it' : 'the master'}")
      @config[:before_exec]&.call(@server)
      re_exec(status)
    end

    # In the new image, once its status listener is served: the old image's stand-in ends.
    def end_standin
      pid = ENV.delete(Reexec::STANDIN_ENV)
      @children.signal(:TERM, Integer(pid)) if pid && !pid.empty?
    end

    # After a re-exec: once every new worker is up, the previous image's workers finish what
    # they are doing and exit.
    def retire_old_workers(wanted)
      return if !@children.handing_over? || !@children.all_started?(wanted)

      @logger.info("new workers ready; #{@children.stop_old} old workers finishing")
    end

    private

    # The mold runs the code that serves: it goes only once the new code has passed its check (a HUP
    # whose code does not boot changes nothing), or when HUP replaces the workers without new code.
    def stop_mold(why)
      return unless @refork&.on?

      @refork.listen # the workers it has forked are the children handed on
      @refork.stop_mold(why)
    end

    # The re-exec itself. From here the master's signals are ignored until the new image has
    # trapped them, milliseconds into its start (Reexec.ignore_signals); those already queued go
    # with it. Returns only when the exec failed (logged; the running workers keep serving).
    def re_exec(status)
      Reexec.ignore_signals
      standin = status_standin(status)
      pending = @signals.pending
      @logger.info("HUP: the new image handles the signals queued here: #{pending.join(' ')}") \
        if pending.intersect?(EarlySignals::NAMES)
      env = @notify ? @notify.env_for_exec : {}
      env = env.merge(Reexec::STANDIN_ENV => standin.to_s) if standin
      env = env.merge(@restart_file.env_for_exec) if @restart_file
      if @jobs # the new image waits for it and starts the new code's
        @jobs.stop("HUP: the new image starts it with the new code")
        env = env.merge(@jobs.env_for_exec)
      end
      Reexec.exec!(@listeners, @children.for_exec, pending: pending, status: status&.listener, env: env)
    rescue SystemCallError, IOError => e
      @children.signal(:TERM, standin) if standin
      @jobs&.resume
      @signals.trap_all
      @logger.error("HUP: re-exec failed (#{e.message}); the running workers keep serving")
      @notify&.ready("reload failed, #{Logger.count(@children.size, 'worker')} still serving the old code")
    end

    # While the new image boots (seconds, for a large app), a child of this master answers the
    # status listener in its place: probes (GET /live, /ready) and scrapes keep their answers, the
    # scoreboard's numbers live. The new image ends it (TERM) once its own loop serves the listener;
    # it ends by itself if the master dies, or after Reexec::CHECK_TIMEOUT. Its pid, or nil.
    def status_standin(status)
      return unless status

      master = Process.pid
      Forker.process do
        # The master's traps came with the fork and would write to its self-pipe, closed below (a HUP
        # sent while this forked raised IOError here: seen on Ruby 4.0): the master's signals are the
        # master's; TERM is this process's own.
        @signals.names.each { |sig| trap(sig, "IGNORE") }
        trap(:TERM) { status.stop_accepting } # the new image serves the listener: finish, then exit
        @signals.close_in_child
        @listeners.each { |l| l.io.close unless l.io.closed? }
        @children.close_in_child
        $0 = "blackbuck status (master #{master} reloading)"
        give_up = now + Reexec::CHECK_TIMEOUT
        while Process.ppid == master && now < give_up && !status.done?
          readable, writable = IO.select(status.readers, status.writers, nil, [status.timeout || 0.5, 0.5].min)
          status.serve(readable || [], writable || [])
        end
        exit!(0)
      end
    rescue SystemCallError => e
      @logger.warn("HUP: no stand-in for the status listener while the new code boots (#{e.message})")
      nil
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
