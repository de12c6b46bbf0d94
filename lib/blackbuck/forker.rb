# frozen_string_literal: true

require "socket"
require_relative "master/children"
require_relative "worker/worker"
require_relative "worker/hijacked"
require_relative "mold/mold"
require_relative "messages"

module Blackbuck
  # Every process the server forks is forked here, and what runs first in it is set here: the
  # master's traps undone, then its job (the worker's loop, the mold's loop), and exit! (nothing of
  # the master's at-exit code runs in a child). Four forks, each in the process that makes it:
  # - #worker, in the master: the worker of a scoreboard slot, from the app the master holds;
  # - #booting_mold, in the master when it does not hold the app (refork_after, the blackbuck
  #   command): the mold that loads the app (AppSource#boot) and then forks generation 0;
  # - #mold_from_worker, in a worker told to fork the mold (Worker#run returned :mold);
  # - #worker_from_mold, in the mold: a worker, forked twice over so the master reaps it.
  # And Forker.process, for a child of the master's that runs none of the server's code paths (the
  # status stand-in of a HUP: Reload).
  # A worker or mold that fails says why on a pipe, one line, which the master reads when it reaps
  # it (#crash_reason): the log line of a worker that cannot boot names the cause.
  class Forker
    # A child process that runs the block and then exit!s (never back into the caller's code).
    def self.process(&) = Process.fork(&)

    # server: what the hooks get as their first argument (the Supervisor); traps: the signals the
    # master traps, set back to their defaults in every child; refork: the master's Refork (its
    # announcement line goes to every worker: any may be told to fork the mold).
    # source: the AppSource (the app the master holds, or what a mold boots).
    def initialize(server:, config:, source:, listeners:, scoreboard:, logger:, traps:, refork: nil)
      @server = server
      @config = config
      @source = source
      @app = source.app # nil in the master when a mold boots it (#booting_mold)
      @listeners = listeners
      @scoreboard = scoreboard
      @logger = logger
      @traps = traps
      @refork = refork
      # Why a worker crashed, from the worker (Messages::Crash, one line each), for the master's log
      # line when workers cannot boot.
      @crash_r, @crash_w = IO.pipe
      @crashes = {} # pid => reason, until that worker is reaped
      # Connections move between this master's workers over it (Native::Handoff, handoff_after).
      # Made once per generation, so a HUP re-exec's workers never take the old ones' (close-on-exec).
      @handoff = config[:handoff_after].positive? ? Socket.pair(:UNIX, :SEQPACKET) : nil
    end

    # In the master: forks the worker of slot index and returns its Children::Child. The block runs
    # first in the new process: it closes what the master holds that a worker must not (its
    # wake-up pipe, the status listener, the other workers' control pipes).
    def worker(index)
      control_r, control_w = IO.pipe
      @config[:before_fork]&.call(@server, index)
      pid = fork do
        # The master's traps first: one of them arriving after the block below closed the master's
        # wake-up pipe would raise here, outside run_worker's rescue, and run the master's code.
        @traps.each { |sig| trap(sig, "DEFAULT") }
        control_w.close
        @crash_r.close
        yield
        run_worker(index, control_r)
      end
      control_r.close
      Children::Child.new(index, pid, control_w, Process.clock_gettime(Process::CLOCK_MONOTONIC), false,
                          @refork&.generation || 0, :master)
    end

    # In the master, when it does not hold the app (refork_after: the blackbuck command leaves it
    # to a mold): forks the process that loads it and runs the warm-up (AppSource#boot), and then runs
    # as the mold every worker forks from until a refork makes a warmer one (Mold#run). Returns its pid.
    # The block runs first in it, as in #worker's. A boot that fails says why on the crash pipe
    # (#crash_reason).
    def booting_mold
      fork do
        @traps.each { |sig| trap(sig, "DEFAULT") }
        # The master decides (a Ctrl-C reaches the whole process group): it sends TERM
        trap(:INT, "IGNORE")
        %i[TERM QUIT].each { |sig| trap(sig) { exit!(0) } }
        @crash_r.close
        yield
        $0 = "blackbuck mold (booting the app)"
        step = nil
        @app = @source.boot(@logger, step: ->(s) { step = s })
        step = "the mold"
        mold(index: nil).run
      rescue Exception => e # rubocop:disable Lint/RescueException -- never back into the master's code
        @logger.error("mold (pid #{Process.pid}): #{step} failed: #{e.message.lines.first&.chomp}") unless e.is_a?(SystemExit)
        tell_crash(e.message.lines.first&.chomp.to_s) unless e.is_a?(SystemExit)
        flush_std
        exit!(1)
      end
    end

    # In the mold: the worker of slot index, with its control pipe, forked twice over: the middle
    # process forks it and exits, so it is orphaned to the master (the child subreaper), and says
    # its pid on answers (Messages::Spawned) first. Returns once the middle has exited; raises
    # when it cannot fork (the mold answers Messages::SpawnFailed).
    def worker_from_mold(index, control, answers)
      middle = fork do
        pid = fork do
          answers.close
          @traps.each { |sig| trap(sig, "DEFAULT") }
          run_worker(index, control) # never returns
        end
        begin
          Messages.send_datagram(answers, Messages::Spawned.new(index, pid))
        rescue IOError, SystemCallError
          nil # the master is done with this mold (it stops, or gave up on it): the worker sees its pipe close
        end
        exit!(0)
      end
      Process.wait(middle)
    end

    # In the master, once pid is reaped: why it crashed (what it wrote before it died), or nil.
    def crash_reason(pid)
      Messages.receive_crashes(@crash_r).each do |crash|
        @crashes[crash.pid] = crash.why if crash.is_a?(Messages::Crash) # (a line that is none: nothing to say)
      end
      @crashes.delete(pid)
    end

    private

    def run_worker(index, control)
      batch_scheduling if @config[:sched_batch] # before the hook, so threads it starts inherit it
      hook = "after_fork"
      @config[:after_fork]&.call(@server, index)
      hook = nil
      role = Worker.new(index: index, app: @app, config: @config, listeners: @listeners, control: control,
                        scoreboard: @scoreboard, logger: @logger, requests_limit: requests_limit, handoff: @handoff,
                        mold_line: @refork&.line).run
      flush_std
      if role == :mold
        hook = "the mold"
        mold_from_worker(index)
      end
      exit!(0)
    rescue Exception => e # rubocop:disable Lint/RescueException -- a worker must never fall back into the master's code
      @logger.exception("worker #{index} crashed", e)
      tell_crash("#{hook || 'the worker'} raised #{e.class}: #{e.message.lines.first&.chomp}")
      flush_std
      exit!(1)
    end

    # In a worker told to fork the mold, once it has stopped serving: forks the mold (the sockets
    # the app took over stay the worker's: the mold closes its copies, Hijacked), waits until it has
    # announced itself to the master (or Mold::READY_SECONDS), and returns its pid; the worker then
    # exits. The master adopts the mold by its announcement, and reaps the worker as any other.
    def mold_from_worker(index)
      ready_r, ready_w = IO.pipe
      pid = fork do
        ready_r.close
        closed = Hijacked.close_all
        mold(index: index, ready: ready_w, closed: closed).run
      end
      ready_w.close
      ready_r.wait_readable(Mold::READY_SECONDS)
      pid
    ensure
      ready_r&.close
    end

    def mold(index:, ready: nil, closed: nil)
      Mold.new(forker: self, line: @refork.line, config: @config, logger: @logger, server: @server, index: index,
               ready: ready, closed: closed)
    end

    # exit! skips Ruby's at-exit flush: what the app logged to $stdout or $stderr (Rails in
    # production logs to STDOUT) would be lost with the worker.
    def flush_std
      [$stdout, $stderr, STDOUT, STDERR].uniq.each do |io|
        io.flush
      rescue IOError, SystemCallError
        nil
      end
    end

    # In a crashing worker: why, for the master (#crash_reason); one line, written at once or not at all.
    def tell_crash(reason)
      Messages.tell(@crash_w, Messages::Crash.new(Process.pid, reason))
    rescue IOError, SystemCallError
      nil
    end

    # sched_batch: the worker is a batch task (see Native.sched_batch). Where the kernel refuses
    # (a seccomp profile, say) the worker says so and runs as a normal task.
    def batch_scheduling
      Native.sched_batch
    rescue SystemCallError => e
      @logger.warn("worker #{Process.pid} cannot use SCHED_BATCH (#{e.message}); running as a normal task")
    end

    # Each worker recycles after a number of requests drawn from [min, max], so they do not
    # all restart at once.
    def requests_limit
      max = @config[:max_requests_per_child]
      return 0 unless max.positive?

      min = @config[:min_requests_per_child] || max
      rand(min..max)
    end
  end
end
