# frozen_string_literal: true

require_relative "worker"
require_relative "status"
require_relative "request_counts"
require_relative "systemd_notify"

module Blackbuck
  # The master process: forks workers from the preloaded app, keeps their number, replaces
  # the dead and the stuck, and turns signals into actions. Traps only enqueue and wake the
  # loop; #run's `case` is the whole lifecycle (docs/SIGNALS.md follows it branch for branch).
  class Supervisor
    # ready: it has taken its scoreboard slot (booted) since it was forked.
    Child = Struct.new(:index, :pid, :control, :started_at, :timeout_sent_at, :ready)

    SIGNALS = %i[TERM INT QUIT HUP TTIN TTOU USR1 CHLD].freeze
    TIMEOUT_KILL_GRACE = 5  # seconds after the timeout notice (USR2) before SIGKILL
    RESPAWN_BACKOFF = 1     # seconds to wait before replacing a worker that died within a second;
                            # the first wait after a worker that could not boot, doubled each time
    RESPAWN_BACKOFF_MAX = 8 # seconds: the longest of those waits
    BOOT_ATTEMPTS = 10      # workers that exit before they are ready, in a row (none becoming ready
                            # meanwhile), after which the master gives up and exits 1
    FORCE_GRACE = 5         # seconds a forced stop (a second INT/TERM) gives a request already in the app

    def initialize(config:, app:, listeners:, logger:, old_workers: [], notify: nil)
      @old_workers = old_workers.to_h # pid => control IO (nil once told to stop), from previous images (HUP)
      @config = config
      @app = app
      @listeners = listeners
      @logger = logger
      @wanted = config[:workers]
      @children = {} # pid => Child
      @queue = []
      @stopping = false
      @scoreboard = Native::Scoreboard.new([@wanted * 4, 64].max.clamp(1, 4096))
      @request_counts = RequestCounts.new(@scoreboard)
      @wake_r, @wake_w = IO.pipe
      @notify = notify       # SystemdNotify under a Type=notify unit, else nil
      @announced = false     # READY=1 said for the current set of workers
      @drain_until = nil     # shutdown_delay: when TERM's delay is over
      @boot_failures = 0     # workers that exited before they were ready, since one last became ready
      @boot_backoff = nil    # seconds the last respawn after a boot failure waited
      @exit_status = 0       # 1 once the workers cannot boot
      # Why a worker crashed, from the worker (one line each: "PID REASON"), for the master's log
      # line when workers cannot boot.
      @crash_r, @crash_w = IO.pipe
      @crashes = {} # pid => reason, until that worker is reaped
      # Connections move between this master's workers over it (Native::Handoff, handoff_after).
      # Made once per generation, so a HUP re-exec's workers never take the old ones' (close-on-exec).
      @handoff = config[:handoff_after].positive? ? Socket.pair(:UNIX, :SEQPACKET) : nil
    end

    # Serving, as GET /ready tells a load balancer or Kubernetes: not from the moment a stop
    # (or TERM's shutdown_delay) begins.
    # And only once a worker serves: a balancer that sends clients to a host whose workers are still
    # booting makes them wait in the listen queue.
    def ready? = !@stopping && @drain_until.nil? && serving?

    # A worker has taken its scoreboard slot (it is in its loop), or the previous image's workers
    # still serve (a HUP re-exec).
    def serving?
      @old_workers.any? || @children.each_value.any? { |c| @scoreboard.read(c.index)[0] == c.pid }
    end

    # A graceful stop, as TERM: safe from a signal trap or another thread (Server::Control#stop).
    def stop = enqueue(:TERM)

    attr_reader :children, :request_counts

    def run
      kept = Reexec.status_listener # a HUP re-exec's
      if @config[:stats_listen]
        @status = StatusServer.start(@config[:stats_listen], supervisor: self, scoreboard: @scoreboard,
                                                             listeners: @listeners, logger: @logger, inherited: kept)
      else
        kept&.close
      end
      end_status_standin
      SIGNALS.each { |sig| trap(sig) { enqueue(sig) } }
      early = EarlySignals.take # a re-exec's: those that arrived while the new code booted
      unless early.empty?
        @logger.info("signals received while this image booted, handled now: #{early.join(' ')}")
        early.each { |sig| enqueue(sig) }
      end
      $0 = "blackbuck master #{@listeners.map(&:name).join(' ')}"
      turn until @stopping
      shutdown
    end

    private

    # One turn of the master's loop: a queued signal, or the housekeeping. No exception here ends
    # the master (the workers keep serving): it is logged and the loop goes on.
    def turn
      case (sig = @queue.shift)
      when nil
        reap
        enforce_timeouts
        spawn_missing
        retire_old_workers
        reload if @reload_pending && !handing_over?
        @request_counts.sample(live_slots)
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
        reload
      when :TTIN
        @wanted += 1 if @wanted < @scoreboard.size
        @logger.info("TTIN: workers = #{@wanted}")
        @announced = false
      when :TTOU
        @wanted -= 1 if @wanted > 1
        @logger.info("TTOU: workers = #{@wanted}")
        @announced = false
        @children.each_value { |c| tell_stop(c) if c.index >= @wanted }
      when :USR1
        reopen_log
        (@children.keys + @old_workers.keys).each { |pid| signal(:USR1, pid) } # old ones still write to it too
      when :CHLD
        reap
      else
        raise "[BUG] unexpected signal #{sig}"
      end
    end

    # USR1 (logrotate moved the file): opens the log file again and says so in the new one.
    def reopen_log
      @logger.reopen
      @logger.info(@config[:log] ? "USR1: reopened log file #{@config[:log]}" : "USR1: no log file to reopen (logging to stderr)")
    end

    def enqueue(sig)
      @queue << sig
      @wake_w.write_nonblock(".", exception: false)
    end

    # The slots of workers that have started (taken their slot): the ones whose numbers are live.
    def live_slots = @children.values.select { |c| @scoreboard.read(c.index)[0] == c.pid }.map(&:index)

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
      return if @announced || @children.size < @wanted
      return unless @children.all? { |pid, c| @scoreboard.read(c.index)[0] == pid }

      @announced = true
      @notify.ready("#{@children.size} workers, pid #{Process.pid}")
    end

    # Up to seconds, or until a signal wakes the loop; status connections are served meanwhile
    # (never waited for), and the sleep ends by their next deadline so it is kept.
    def sleep_until_woken(seconds = 1, status: @status)
      seconds = [seconds, status.timeout].compact.min if status
      readable, writable = IO.select([@wake_r, *status&.readers], status&.writers, nil, seconds)
      @wake_r.read_nonblock(1024, exception: false)
      status&.serve(readable || [], writable || [])
    end

    def spawn_missing
      note_ready
      taken = @children.values.map(&:index)
      (0...@wanted).each do |i|
        next if taken.include?(i)
        return if @respawn_after && Process.clock_gettime(Process::CLOCK_MONOTONIC) < @respawn_after

        spawn(i)
      end
    end

    def spawn(index)
      control_r, control_w = IO.pipe
      @config[:before_fork]&.call(self, index)
      pid = fork do
        control_w.close
        [@wake_r, @wake_w, @crash_r].each(&:close)
        @status&.close_in_child
        @children.each_value { |c| c.control.close }
        @old_workers.each_value { |io| io.close unless io.nil? || io.closed? }
        run_worker(index, control_r)
      end
      control_r.close
      @children[pid] = Child.new(index, pid, control_w, Process.clock_gettime(Process::CLOCK_MONOTONIC), nil, false)
    end

    def run_worker(index, control)
      SIGNALS.each { |sig| trap(sig, "DEFAULT") }
      batch_scheduling if @config[:sched_batch] # before the hook, so threads it starts inherit it
      hook = "after_fork"
      @config[:after_fork]&.call(self, index)
      hook = nil
      Worker.new(index: index, app: @app, config: @config, listeners: @listeners, control: control,
                 scoreboard: @scoreboard, logger: @logger, requests_limit: requests_limit, handoff: @handoff).run
      flush_std
      exit!(0)
    rescue Exception => e # rubocop:disable Lint/RescueException -- a worker must never fall back into the master's code
      @logger.exception("worker #{index} crashed", e)
      tell_crash("#{hook || 'the worker'} raised #{e.class}: #{e.message.lines.first&.chomp}")
      flush_std
      exit!(1)
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

    # In a crashing worker: why, for the master (#reap); one line, written at once or not at all.
    def tell_crash(reason)
      @crash_w.write_nonblock("#{Process.pid} #{reason.byteslice(0, 1000).scrub.tr("\n", ' ')}\n", exception: false)
    rescue IOError, SystemCallError
      nil
    end

    # Workers that have taken their slot since the last look: each is a boot that worked, so the
    # boot failures in a row start again from none.
    def note_ready
      @children.each_value { |c| booted(c) unless c.ready || @scoreboard.read(c.index)[0] != c.pid }
    end

    def booted(child)
      child.ready = true
      @boot_failures = 0
      @boot_backoff = nil
    end

    # A worker that exited before it was ready: it is replaced after a wait that doubles with each
    # such exit in a row (RESPAWN_BACKOFF .. RESPAWN_BACKOFF_MAX; one wait for all the workers that
    # failed together). After BOOT_ATTEMPTS in a row the workers cannot boot: the master stops and
    # exits 1 (a supervisor such as systemd then sees the failure), rather than forking for ever
    # while clients wait in the listen queue. Not while a HUP's previous workers still serve: they
    # go on serving the old code, and the new workers are tried on (every RESPAWN_BACKOFF_MAX).
    def boot_failed(child, how)
      @boot_failures += 1
      why = @crashes.delete(child.pid) || how
      if @boot_failures >= BOOT_ATTEMPTS && !handing_over?
        @logger.error("workers cannot boot: #{why} (#{@boot_failures} attempts in a row); exiting")
        @exit_status = 1
        @stopping = true
        return
      end
      unless @respawn_after && now < @respawn_after # the workers that failed together wait once
        @boot_backoff = @boot_backoff ? [@boot_backoff * 2, RESPAWN_BACKOFF_MAX].min : RESPAWN_BACKOFF
        @respawn_after = now + @boot_backoff
      end
      @logger.warn("worker #{child.index} (pid #{child.pid}) #{how} before it was ready (#{why}; boot failure " \
                   "#{@boot_failures} of #{BOOT_ATTEMPTS} in a row); replacing it in #{(@respawn_after - now).ceil}s")
    end

    # The crash reasons workers wrote since the last look (#tell_crash), by pid.
    def read_crashes
      while (data = @crash_r.read_nonblock(65_536, exception: false)).is_a?(String)
        data.each_line do |line|
          pid, reason = line.chomp.split(" ", 2)
          @crashes[pid.to_i] = reason if reason
        end
      end
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

    def reap
      loop do
        pid, status = Process.wait2(-1, Process::WNOHANG)
        break unless pid

        if @old_workers.key?(pid)
          old = @old_workers.delete(pid)
          old.close unless old.nil? || old.closed?
          @logger.info("old worker (pid #{pid}) exited")
        end
        child = @children.delete(pid)
        next unless child

        @request_counts.worker_exited(child.index, pid) # before spawn_missing lets a new worker reset the slot
        child.control.close unless child.control.closed?
        read_crashes
        lived = Process.clock_gettime(Process::CLOCK_MONOTONIC) - child.started_at
        how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
        booted(child) if !child.ready && @scoreboard.read(child.index)[0] == pid # ready, then gone before #note_ready saw it
        if status.success?
          @logger.info("worker #{child.index} (pid #{pid}) #{how}")
        elsif !child.ready && !@stopping
          boot_failed(child, how)
        else
          @logger.warn("worker #{child.index} (pid #{pid}) #{how}#{'; replacing it' unless @stopping}")
          @respawn_after = Process.clock_gettime(Process::CLOCK_MONOTONIC) + RESPAWN_BACKOFF if lived < 1
        end
        @crashes.delete(pid)
        @config[:after_worker_exit]&.call(self, child.index, status)
      rescue Errno::ECHILD
        break
      end
    end

    # --timeout: USR2 makes the worker raise RequestTimeout inside the app (the client gets a
    # 503 and the log a backtrace); a worker that does not come back is killed. 0: no timeout (the
    # default in development).
    def enforce_timeouts
      return if @config[:timeout].zero?

      limit_ms = @config[:timeout] * 1000
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @children.each_value do |c|
        _pid, _state, _reqs, running_ms, _hb, _conns, method, path = @scoreboard.read(c.index)
        if running_ms <= limit_ms
          c.timeout_sent_at = nil
        elsif c.timeout_sent_at.nil?
          @logger.error("worker #{c.index} (pid #{c.pid}) timeout: #{method} #{path} running for #{running_ms / 1000.0}s")
          c.timeout_sent_at = t
          signal(:USR2, c.pid)
        elsif t - c.timeout_sent_at > TIMEOUT_KILL_GRACE
          @logger.error("worker #{c.index} (pid #{c.pid}) did not stop after the timeout; killing it")
          signal(:KILL, c.pid)
        end
      end
    end

    # HUP: boot the new code in a separate process first; only if it boots, re-exec this
    # master with it (see Reexec). Started another way (rackup), HUP replaces the workers.
    # A HUP while the previous one's new workers are still starting waits for them (HUPs that
    # arrive meanwhile make one reload); old workers already told to stop are handed to the next
    # image to reap, however many reloads ago they were started.
    def reload
      unless Reexec.available?
        @logger.info("HUP: replacing every worker (started without the blackbuck command: no code reload)")
        @children.each_value { |c| tell_stop(c) }
        return
      end
      if handing_over?
        @logger.info("HUP: the previous reload's new workers are still starting; reloading once they serve") \
          unless @reload_pending
        @reload_pending = true
        return
      end
      @reload_pending = false
      @logger.info("HUP: checking that the new code boots")
      @notify&.reloading
      if (error = Reexec.check { |wait| announce_watchdog; sleep_until_woken(wait) })
        @logger.error("HUP: the new code does not boot; the running workers keep serving: #{error}")
        @notify&.ready("reload failed, #{@children.size} workers still serving the old code")
        return
      end
      if @queue.intersect?(%i[TERM INT QUIT])
        @logger.info("HUP: a stop was asked while the new code booted; stopping instead of re-executing")
        return
      end
      @logger.info("HUP: re-executing the master (pid #{Process.pid}) with the new code")
      @config[:before_exec]&.call(self)
      re_exec
    end

    # The re-exec itself. From here the master's signals are ignored until the new image has
    # trapped them, milliseconds into its start (Reexec.ignore_signals); those already queued go
    # with it. Returns only when the exec failed (logged; the running workers keep serving).
    def re_exec
      Reexec.ignore_signals
      standin = status_standin
      old = @children.map { |pid, c| [pid, c.control] } + @old_workers.to_a
      pending = @queue.dup
      @logger.info("HUP: the new image handles the signals queued here: #{pending.join(' ')}") \
        if pending.intersect?(EarlySignals::NAMES)
      env = @notify ? @notify.env_for_exec : {}
      env = env.merge(Reexec::STANDIN_ENV => standin.to_s) if standin
      Reexec.exec!(@listeners, old, pending: pending, status: @status&.listener, env: env)
    rescue SystemCallError, IOError => e
      signal(:TERM, standin) if standin
      SIGNALS.each { |sig| trap(sig) { enqueue(sig) } }
      @logger.error("HUP: re-exec failed (#{e.message}); the running workers keep serving")
      @notify&.ready("reload failed, #{@children.size} workers still serving the old code")
    end

    # While the new image boots (seconds, for a large app), a child of this master answers the
    # status listener in its place: probes (GET /live, /ready) and scrapes keep their answers, the
    # scoreboard's numbers live. The new image ends it (TERM) once its own loop serves the listener;
    # it ends by itself if the master dies, or after Reexec::CHECK_TIMEOUT. Its pid, or nil.
    def status_standin
      return unless @status

      master = Process.pid
      fork do
        trap(:TERM) { @status.stop_accepting } # the new image serves the listener: finish, then exit
        [@wake_r, @wake_w, *@listeners.map(&:io)].each { |io| io.close unless io.closed? }
        @children.each_value { |c| c.control.close unless c.control.closed? }
        @old_workers.each_value { |io| io.close unless io.nil? || io.closed? }
        $0 = "blackbuck status (master #{master} reloading)"
        give_up = now + Reexec::CHECK_TIMEOUT
        while Process.ppid == master && now < give_up && !@status.done?
          readable, writable = IO.select(@status.readers, @status.writers, nil, [@status.timeout || 0.5, 0.5].min)
          @status.serve(readable || [], writable || [])
        end
        exit!(0)
      end
    rescue SystemCallError => e
      @logger.warn("HUP: no stand-in for the status listener while the new code boots (#{e.message})")
      nil
    end

    # In the new image, once its status listener is served: the old image's stand-in ends.
    def end_status_standin
      pid = ENV.delete(Reexec::STANDIN_ENV)
      signal(:TERM, Integer(pid)) if pid && !pid.empty?
    end

    # After a re-exec, until every new worker serves and the previous image's are told to stop.
    def handing_over? = @old_workers.each_value.any? { |io| io && !io.closed? }

    # The watchdog keeps hearing from the loop while a HUP's boot check blocks it.
    def announce_watchdog
      return unless @notify&.watchdog_interval && now >= (@watchdog_at ||= 0)

      @watchdog_at = now + @notify.watchdog_interval
      @notify.watchdog
    end

    # After a re-exec: once every new worker is up, the previous image's workers finish what
    # they are doing and exit.
    def retire_old_workers
      return if !handing_over? || @children.size < @wanted
      return unless @children.all? { |pid, c| @scoreboard.read(c.index)[0] == pid }

      @logger.info("new workers ready; #{stop_old_workers} old workers finishing")
    end

    # The previous images' workers that still have a control pipe are told to finish and exit;
    # each stays listed (without its pipe) until it is reaped. How many were told.
    def stop_old_workers
      told = 0
      @old_workers.each do |pid, io|
        next if io.nil?

        begin
          io.write_nonblock(Worker::STOP_MESSAGE, exception: false) unless io.closed?
          told += 1
        rescue IOError, SystemCallError
          nil
        end
        io.close unless io.closed?
        @old_workers[pid] = nil
      end
      told
    end

    def tell_stop(child, message = Worker::STOP_MESSAGE)
      child.control.write_nonblock(message, exception: false) unless child.control.closed?
    rescue IOError, SystemCallError
      nil
    end

    def signal(sig, pid)
      Process.kill(sig, pid)
    rescue Errno::ESRCH
      nil
    end

    # Stop accepting at once (the listening sockets close here and in every worker), let the
    # workers finish what is in flight, then kill whatever is left after graceful_timeout. Stop
    # signals keep counting meanwhile: a second INT or TERM forces the stop (workers close every
    # connection and exit once the request they run is answered, at most FORCE_GRACE seconds), a
    # third one, or a QUIT, kills the workers and exits at once.
    def shutdown
      @listeners.each(&:close)
      @notify&.stopping("stopping gracefully (up to #{@config[:graceful_timeout]}s)")
      @children.each_value { |c| tell_stop(c) }
      stop_old_workers # after a HUP not yet complete: they stop too
      # A worker whose app runs reads its pipe only after the request: this makes it close its
      # listeners now, so new connections are refused instead of queued (Worker#stop_accepting_in_app).
      (@children.keys + @old_workers.keys).each { |pid| signal(Worker::STOP_ACCEPTING_SIGNAL, pid) }
      stops = 1
      deadline = now + @config[:graceful_timeout] + 1
      until @children.empty? && @old_workers.empty?
        case (sig = @queue.shift)
        when nil
          reap
          break if now > deadline

          announce_watchdog
          sleep_until_woken(0.05) # GET /ready keeps answering 503 meanwhile
        when :TERM, :INT, :QUIT
          stops += 1
          return exit_at_once(sig) if sig == :QUIT || stops > 2

          @logger.info("#{sig} again: forcing the stop: workers close every connection and exit after the request " \
                       "they are running (at most #{FORCE_GRACE}s); #{sig} once more exits at once")
          @children.each_value { |c| tell_stop(c, Worker::FORCE_MESSAGE) }
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

    def kill_workers(why)
      (@children.keys + @old_workers.keys).each do |pid|
        @logger.warn("worker pid #{pid} #{why}; killing it")
        signal(:KILL, pid)
      end
      wait_until = now + 5 # SIGKILL cannot be caught: they are gone within moments
      until (@children.empty? && @old_workers.empty?) || now > wait_until
        reap
        sleep 0.01
      end
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
