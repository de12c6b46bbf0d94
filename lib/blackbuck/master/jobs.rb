# frozen_string_literal: true

require_relative "children"

module Blackbuck
  # The app's job runner as a child of the master (the solid_queue setting, or $SOLID_QUEUE_IN_PUMA
  # as Kamal's generated deploy.yml sets it): what Solid Queue's Puma plugin does for Puma. The
  # master runs the app's bin/jobs (Rails 8 generates it; it runs Solid Queue's supervisor), spawned
  # with the server's environment from the app's directory: exec'd, never a fork of the master,
  # which may not hold the app (reforking). It is
  # - restarted when it dies, after a back-off that doubles while it keeps dying young (the Puma
  #   plugin stops Puma instead: here the web side serves on, and the log says why jobs stopped);
  # - stopped with the server: TERM (Solid Queue finishes its claimed jobs), KILL after
  #   graceful_timeout;
  # - on HUP, told to stop just before the re-exec; the new image waits for it (it is still this
  #   pid's child) and starts bin/jobs afresh with the new code.
  # The master's loop drives it: #turn in the idle branch, #reaped for every child not a worker.
  class Jobs
    OLD_ENV = "BLACKBUCK_OLD_JOBS" # the previous image's runners, told to stop: "pid:seconds_left,..."
    BACKOFF_FIRST = 1   # seconds before restarting a runner that died young
    BACKOFF_MAX = 30    # seconds: the back-off doubles up to this
    YOUNG = 10          # seconds: a runner that dies sooner doubles the next back-off; one that ran longer resets it

    # The one line a server asked to run jobs without a runner gets: nil when bin/jobs is there.
    def self.missing(config)
      path = File.join(config.app_dir, Config::JOBS_COMMAND)
      return nil if File.file?(path) && File.executable?(path)

      var = config.origin(:solid_queue) # "$SOLID_QUEUE_IN_PUMA", or nil: the setting asked
      off = var ? "unset #{var.delete_prefix('$')}" : "set solid_queue false"
      "#{var || 'solid_queue'} asks for Solid Queue's supervisor, but #{path} is " \
        "#{File.exist?(path) ? 'not executable' : 'missing'} (bin/rails solid_queue:install makes it; or #{off} " \
        "and run the jobs another way)"
    end

    def initialize(config, logger, env: ENV)
      @dir = config.app_dir
      @command = File.join(@dir, Config::JOBS_COMMAND)
      @graceful = config[:graceful_timeout]
      @logger = logger
      @pid = nil
      @started_at = nil
      @start_at = now      # when to start one (the first at once)
      @backoff = BACKOFF_FIRST
      @stopping = {}       # pid => monotonic deadline after which it is SIGKILLed
      adopt_old(env)
    end

    # Nothing of ours is left running.
    def gone? = @pid.nil? && @stopping.empty?

    def pids = [@pid, *@stopping.keys].compact

    # The loop's idle branch: start one when it is due, SIGKILL one that outlived its stop.
    def turn(stopping:)
      kill_overdue
      start if !stopping && @pid.nil? && @start_at && now >= @start_at
    end

    # A child that is not a worker has exited: true if it was ours (logged; restarted later).
    def reaped(pid, status)
      how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
      if @stopping.delete(pid)
        @logger.info("job runner (pid #{pid}) stopped (#{how})")
        return true
      end
      return false unless pid == @pid

      ran = now - @started_at
      delay = ran > YOUNG ? BACKOFF_FIRST : @backoff
      @backoff = ran > YOUNG ? BACKOFF_FIRST * 2 : [delay * 2, BACKOFF_MAX].min
      @pid = nil
      @start_at = now + delay
      @logger.error("job runner #{Config::JOBS_COMMAND} (pid #{pid}) #{how} after #{ran.round(1)}s; " \
                    "restarting it in #{delay}s")
      true
    end

    # The server stops (or HUP re-execs): TERM to the runner; #turn SIGKILLs it after graceful_timeout.
    def stop(why)
      @start_at = nil
      return unless @pid

      @logger.info("job runner (pid #{@pid}): TERM (#{why}); waiting up to #{@graceful}s for its jobs")
      Children.signal(:TERM, @pid)
      @stopping[@pid] = now + @graceful
      @pid = nil
    end

    # A HUP's re-exec failed after #stop: start one again (with the code this image runs).
    def resume
      @start_at ||= now
    end

    # Whatever is left when the master exits at once, or its wait is over: SIGKILL (the master
    # reaps it with its workers).
    def kill_all
      pids.each do |pid|
        @logger.warn("job runner (pid #{pid}) still running; killing it")
        Children.signal(:KILL, pid)
      end
    end

    # For a HUP re-exec: the runners still stopping, with what is left of their time.
    def env_for_exec
      return {} if @stopping.empty?

      { OLD_ENV => @stopping.map { |pid, deadline| "#{pid}:#{[deadline - now, 0].max.round(3)}" }.join(",") }
    end

    private

    def start
      @pid = Process.spawn(@command, chdir: @dir, in: File::NULL, close_others: true)
      @started_at = now
      @logger.info("job runner #{Config::JOBS_COMMAND} started (pid #{@pid}, Solid Queue's supervisor)")
    rescue SystemCallError => e
      @pid = nil
      @start_at = now + BACKOFF_MAX
      @logger.error("job runner #{@command} cannot be started: #{e.message}; trying again in #{BACKOFF_MAX}s")
    end

    def kill_overdue
      @stopping.each do |pid, deadline|
        next if now < deadline

        @logger.warn("job runner (pid #{pid}) still running after graceful_timeout; killing it")
        Children.signal(:KILL, pid)
        @stopping[pid] = Float::INFINITY
      end
    end

    # In a new image: the previous image's runner, told to stop, is this process's child still.
    def adopt_old(env)
      spec = env.delete(OLD_ENV)
      return if spec.nil? || spec.empty?

      spec.split(",").each do |pair|
        pid, left = pair.split(":")
        @stopping[Integer(pid)] = now + Float(left)
      end
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
