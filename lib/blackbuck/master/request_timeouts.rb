# frozen_string_literal: true

module Blackbuck
  # --timeout, looked at by the master every turn of its loop: a worker whose request has run
  # longer gets USR2 and raises RequestTimeout inside the app (the client gets a 503 and the log a
  # backtrace); one that has not come back KILL_GRACE seconds later is killed. 0: no timeout (the
  # default in development). The running time is the worker's scoreboard slot's request clock.
  class RequestTimeouts
    KILL_GRACE = 5 # seconds after the timeout notice (USR2) before SIGKILL

    # clock: the monotonic seconds (a test passes its own).
    def initialize(seconds, scoreboard, logger, clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) })
      @limit_ms = seconds * 1000
      @scoreboard = scoreboard
      @logger = logger
      @clock = clock
      @noticed = {} # pid => when it was sent USR2, while that request still runs
    end

    # Was worker pid sent the timeout notice for the request it runs (until the next #check after it
    # is reaped)? The master counts its exit as a timeout (WorkerExits).
    def noticed?(pid) = @noticed.key?(pid)

    # children: Children (each, [], signal).
    def check(children)
      return if @limit_ms.zero?

      t = @clock.call
      @noticed.keep_if { |pid, _| children[pid] } # the reaped are forgotten
      children.each do |c|
        slot = @scoreboard.read(c.index)
        if slot.running_ms <= @limit_ms
          @noticed.delete(c.pid)
        elsif !@noticed.key?(c.pid)
          @logger.error("worker #{c.index} (pid #{c.pid}) timeout: #{slot.request_method} #{slot.path} " \
                        "running for #{slot.running_ms / 1000.0}s")
          @noticed[c.pid] = t
          children.signal(:USR2, c.pid)
        elsif t - @noticed[c.pid] > KILL_GRACE
          @logger.error("worker #{c.index} (pid #{c.pid}) did not stop after the timeout; killing it")
          children.signal(:KILL, c.pid)
        end
      end
    end
  end
end
