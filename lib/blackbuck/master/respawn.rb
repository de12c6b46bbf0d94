# frozen_string_literal: true

module Blackbuck
  # What a worker's exit means for its replacement, and the log line that says so. The master
  # replaces every worker that exits; Respawn decides how soon (#wait?) and when to give up:
  # - one that dies within a second of starting is replaced after BACKOFF;
  # - one that exits before it is ready (an after_fork that raises, a crash while booting) is a
  #   boot failure: it is replaced after a wait that doubles with each such exit in a row
  #   (BACKOFF .. BACKOFF_MAX; one wait for all the workers that failed together). After
  #   BOOT_ATTEMPTS in a row the workers cannot boot, and #exited says so: the master stops and
  #   exits 1 (a supervisor such as systemd then sees the failure) rather than forking for ever
  #   while clients wait in the listen queue. Not while a HUP's previous workers still serve: they
  #   go on serving the old code, and the new workers are tried on (every BACKOFF_MAX).
  # A worker that becomes ready resets the count (#booted).
  class Respawn
    BACKOFF = 1        # seconds to wait before replacing a worker that died within a second;
                       # the first wait after a worker that could not boot, doubled each time
    BACKOFF_MAX = 8    # seconds: the longest of those waits
    BOOT_ATTEMPTS = 10 # workers that exit before they are ready, in a row (none becoming ready
                       # meanwhile), after which the master gives up and exits 1

    attr_reader :failures

    # clock: the monotonic seconds (a test passes its own).
    def initialize(logger, clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) })
      @logger = logger
      @clock = clock
      @failures = 0  # workers that exited before they were ready, since one last became ready
      @backoff = nil # seconds the last respawn after a boot failure waited
      @after = nil   # no worker is forked before this time
    end

    # Must the next fork wait?
    def wait? = !@after.nil? && now < @after

    # Workers that have taken their slot since the last look: each is a boot that worked.
    def note_ready(children)
      children.each { |c| booted(c) if !c.ready && children.started?(c) }
    end

    def booted(child)
      child.ready = true
      @failures = 0
      @backoff = nil
    end

    # A reaped worker (Children#reap), logged. started: its slot shows it took it (ready, then gone
    # before #note_ready saw it); stopping: the master stops (no replacement is said or counted);
    # handing_over: a HUP's previous workers still serve; why: what the worker said before it died
    # (Forker#crash_reason). True when the workers cannot boot: the master then stops and exits 1.
    def exited(child, status, started:, stopping:, handing_over:, why: nil)
      lived = now - child.started_at
      how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
      booted(child) if !child.ready && started
      if status.success?
        @logger.info("worker #{child.index} (pid #{child.pid}) #{how}")
      elsif !child.ready && !stopping
        return boot_failed(child, how, why || how, handing_over)
      else
        @logger.warn("worker #{child.index} (pid #{child.pid}) #{how}#{'; replacing it' unless stopping}")
        @after = now + BACKOFF if lived < 1
      end
      false
    end

    private

    def boot_failed(child, how, why, handing_over)
      @failures += 1
      if @failures >= BOOT_ATTEMPTS && !handing_over
        @logger.error("workers cannot boot: #{why} (#{@failures} attempts in a row); exiting")
        return true
      end
      unless wait? # the workers that failed together wait once
        @backoff = @backoff ? [@backoff * 2, BACKOFF_MAX].min : BACKOFF
        @after = now + @backoff
      end
      @logger.warn("worker #{child.index} (pid #{child.pid}) #{how} before it was ready (#{why}; boot failure " \
                   "#{@failures} of #{BOOT_ATTEMPTS} in a row); replacing it in #{(@after - now).ceil}s")
      false
    end

    def now = @clock.call
  end
end
