# frozen_string_literal: true

require "socket"
require_relative "children"
require_relative "worker"
require_relative "mold"

module Blackbuck
  # Reforking (refork_after), in the master. Workers forked from the master start with the heap the
  # master had after boot, and each then warms a private copy of what the app loads lazily (Rails'
  # routes and views, caches, YJIT's code). So once a worker of the current generation has served
  # refork_after[generation] requests, it forks the mold (Worker#promote, Mold#fork_from_worker): it
  # stops serving, its idle connections move to its siblings, it forks the mold and exits, and from
  # then on every new worker forks from the mold and shares its warm pages. The previous generation's workers are then replaced one at a time: each is
  # told to retire (its idle connections move to the others) only once every slot has a serving
  # worker, so the server never has fewer than workers - 1 serving. After the list's last count,
  # the generation stays.
  #
  # The blackbuck command's master does not load the app when reforking: a first mold does
  # (Spawner#boot_mold: it loads the app, warms it up, and forks generation 0), so the master holds
  # only Blackbuck, and once a refork replaces that mold, nothing of the app stays in the master
  # that no worker shares. A master given a loaded app (a rack handler's: `rackup`, `rails server`)
  # forks generation 0 itself, as without reforking.
  #
  # The mold is never a point of failure: if it dies, or does not answer a fork within
  # FORK_SECONDS, the master forgets it (killing it if it lives) and forks from itself, or, when it
  # does not hold the app, boots a new mold (BOOT_RETRY_SECONDS apart while boots fail); the next
  # refork makes a warmer one. A first mold that cannot boot the app ends the server, as a
  # config.ru that raises does. An app that says it is no longer fork-safe
  # (Blackbuck.no_longer_fork_safe!) is never reforked: the worker told to become the mold refuses,
  # and reforking turns off (the mold that booted the app stays the one workers fork from).
  class Refork
    FORK_SECONDS = 5 # seconds the master waits for the mold to fork a worker, then forks it itself
    BOOT_RETRY_SECONDS = [1, 2, 5, 10, 30].freeze # after a mold that booted the app failed once it served
    MESSAGE_MAX = Mold::MESSAGE_MAX

    # What the master knows of the mold: its pid, the socket it listens on, its generation (the
    # workers it forks belong to it), and its USS when status asks.
    MoldProcess = Struct.new(:pid, :socket, :generation, :booted)

    attr_reader :generation, :mold

    # counts: config[:refork_after]; subreaper: makes this process the child subreaper, true when
    # it is (unit tests pass their own: the test process stays as it is).
    def initialize(counts, scoreboard:, logger:, subreaper: -> { Native.child_subreaper })
      @counts = counts
      @scoreboard = scoreboard
      @logger = logger
      @generation = 0
      @mold = nil
      @stopped_molds = [] # pids of molds told to stop, until reaped
      @promoting = nil # the Child told to become the mold, until it announces itself or exits
      @retiring = nil  # pid of the previous generation's worker told to retire, until it exits
      @leaving = nil   # pid of the worker that forked the mold, until it exits
      @on = !counts.empty? && subreaper?(subreaper)
      @promoting_on = @on # false once a worker said the app is not fork-safe
      @booting = nil      # pid of the mold loading the app (Spawner#boot_mold), until it announces itself
      @boot_failure = nil # why the first boot failed, for the master to end the server with
      @boot_failures = 0  # in a row, since the last mold that booted
      @boot_after = 0     # monotonic time before which no new boot is tried
      @adopted = false    # a mold that booted the app has announced itself once: the app boots
      @lean = false       # the master does not hold the app (a mold boots it)
      # Workers announce themselves here when they become the mold (one end each way: every worker
      # may be chosen, so every worker inherits the line).
      @inbox, @line = Socket.pair(:UNIX, :SEQPACKET) if @on
    end

    def on? = @on

    # Whether workers are still made molds: false once one said the app is not fork-safe (the mold
    # machinery stays on: a mold that booted the app goes on forking the workers).
    def reforking? = @promoting_on

    # The announcement line's sending end, for the workers (Worker#promote, Mold#run); nil when off.
    attr_reader :line

    # The master's sockets to watch: announcements, and the mold's answers are awaited in #spawn.
    def readers = @on ? [@inbox] : []

    # In a process the master forks: the master's ends are not its own.
    def close_in_child
      @inbox&.close unless @inbox.nil? || @inbox.closed?
      @mold&.socket&.close unless @mold.nil? || @mold.socket.closed?
    end

    # One turn of the master's loop: announcements read, then at most one step: a retirement of a
    # previous generation's worker, or a promotion. wanted: the worker count; quiet: no step now (a
    # HUP's handover, a stop).
    def turn(children, wanted, quiet: false)
      return unless @on

      read_inbox(children)
      return unless @promoting_on # (a worker just said the app is not fork-safe)

      @promoting = nil if @promoting && children[@promoting.pid].nil?
      @retiring = nil if @retiring && children[@retiring].nil?
      @leaving = nil if @leaving && children[@leaving].nil?
      return if quiet || @promoting || @retiring || @leaving || !children.all_started?(wanted)

      if (old = children.find { |c| c.generation < @generation })
        retire(children, old)
      elsif (chosen = due(children))
        promote(children, chosen)
      end
    end

    # A worker for slot index, forked by the mold: its Children::Child, or nil when there is no mold
    # or it failed (then the master forks it itself).
    def spawn(index)
      return unless @mold

      control_r, control_w = IO.pipe
      pid = ask_mold(index, control_r)
      control_r.close
      unless pid
        control_w.close
        return
      end
      Children::Child.new(index, pid, control_w, now, false, @mold.generation, :mold)
    end

    # Whether the master may start a mold that boots the app now: none is booting, none is there,
    # and the last failed boot is BOOT_RETRY_SECONDS old.
    def boot_due? = @on && @booting.nil? && @mold.nil? && @boot_failure.nil? && now >= @boot_after

    # The master forked pid to boot the app and become the mold (Spawner#boot_mold).
    def booting(pid)
      @booting = pid
      @lean = true
      @logger.info("refork: mold (pid #{pid}) is booting the app; workers fork from it")
    end

    # Why the first mold could not boot the app (the server cannot start), once; else nil.
    def take_boot_failure
      why = @boot_failure
      @boot_failure = nil if why
      why
    end

    # A child of the master's that is not a worker has exited: the mold, a previous one, or another
    # child (a HUP's boot check, whose exit is said elsewhere). why: what it said before it died.
    def reaped(pid, status, why = nil)
      how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
      if @booting == pid
        boot_failed(pid, how, why)
      elsif @mold&.pid == pid
        @logger.warn("mold (pid #{pid}, generation #{@mold.generation}) #{how}; workers fork from " \
                     "#{@lean ? 'a new mold that boots the app' : 'the master'} until the next refork")
        forget_mold
      elsif @stopped_molds.delete(pid)
        @logger.info("previous mold (pid #{pid}) #{how}")
      end
    end

    # The server stops, or HUP replaces the code: the mold goes (its workers stay until told), and
    # so does one still booting the app.
    def stop_mold(why)
      stop_booting(why) if @booting
      return unless @mold

      @logger.info("mold (pid #{@mold.pid}) stopping: #{why}")
      @stopped_molds << @mold.pid
      Process.kill(:TERM, @mold.pid)
      forget_mold
    rescue Errno::ESRCH
      forget_mold
    end

    # For /status: the refork generation, the mold (pid, generation, whether it booted the app) or
    # nil, and the pid of a mold still booting the app, or nil.
    def status
      mold = @mold && { "pid" => @mold.pid, "generation" => @mold.generation, "booted_app" => @mold.booted }
      { "generation" => @generation, "mold" => mold, "booting" => @booting }
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def stop_booting(why)
      @logger.info("mold (pid #{@booting}) booting the app stopping: #{why}")
      @stopped_molds << @booting
      Process.kill(:TERM, @booting)
    rescue Errno::ESRCH
      nil
    ensure
      @booting = nil
    end

    # The mold booting the app died before it could fork: the first time, the server cannot start;
    # once the app has booted, a new one is tried a little later (BOOT_RETRY_SECONDS).
    def boot_failed(pid, how, why)
      @booting = nil
      unless @adopted
        @boot_failure = why || "the mold (pid #{pid}) booting the app #{how}"
        return
      end
      wait = BOOT_RETRY_SECONDS[@boot_failures] || BOOT_RETRY_SECONDS.last
      @boot_failures += 1
      @boot_after = now + wait
      @logger.error("refork: the mold (pid #{pid}) booting the app #{how}#{": #{why}" if why}; " \
                    "another boots in #{wait}s (the workers serve on)")
    end

    # Workers forked by the mold are re-parented to the nearest child subreaper when their middle
    # process exits: this master must be one, or it could not reap them.
    def subreaper?(make)
      return true if make.call

      @logger.warn("refork_after: this kernel cannot make the master a child subreaper (Linux >= 3.4); reforking is off")
      false
    end

    # The worker of the current generation that has served its count, if any (the list not exhausted).
    def due(children)
      count = @counts[@generation]
      return unless count

      children.find { |c| c.generation == @generation && @scoreboard.read(c.index)[2] >= count }
    end

    def promote(children, child)
      requests = @scoreboard.read(child.index)[2]
      @logger.info("refork: worker #{child.index} (pid #{child.pid}) served #{requests} requests " \
                   "(refork_after #{@counts[@generation]}); it forks the mold of generation #{@generation + 1}")
      @promoting = child
      children.tell_stop(child, Worker::PROMOTE_MESSAGE)
    end

    def retire(children, child)
      @logger.info("refork: replacing worker #{child.index} (pid #{child.pid}, generation #{child.generation}) " \
                   "with one of generation #{@generation}")
      @retiring = child.pid
      children.tell_stop(child, Worker::RETIRE_MESSAGE)
    end

    # "mold PID WORKER_PID INDEX" with the mold's own socket: the promoted worker forked the mold (it
    # exits now, and its slot goes to the mold's first worker once it is reaped); "mold PID": the
    # mold that booted the app; "unsafe PID WHY": the worker must not be forked, and reforking ends.
    def read_inbox(children)
      loop do
        msg, _addr, _flags, *rights = @inbox.recvmsg_nonblock(MESSAGE_MAX, 0, nil, scm_rights: true, exception: false)
        return if msg == :wait_readable || msg.nil? || msg.empty?

        verb, pid, why = msg.split(" ", 3)
        socket = rights.first&.unix_rights&.first
        case verb
        when "mold" then adopt_mold(children, pid.to_i, socket, *why&.split(" ", 2)&.map(&:to_i))
        when "unsafe"
          @logger.warn("refork: worker #{children[pid.to_i]&.index} (pid #{pid}) is not fork-safe (#{why}); reforking is off")
          @promoting_on = false
          @promoting = nil
        end
      end
    end

    # from, index: the worker that forked it (nil for the mold that booted the app)
    def adopt_mold(children, pid, socket, from = nil, index = nil)
      return adopt_booted(pid, socket) if pid == @booting

      stop_mold("generation #{@generation + 1} has a mold") if @mold
      @generation += 1
      @mold = MoldProcess.new(pid, socket, @generation, false)
      @promoting = nil
      @leaving = from if from && children[from] # until it is reaped
      @logger.info("refork: mold of generation #{@generation} is pid #{pid}" \
                   "#{" (forked by worker #{index}, pid #{from}, which exits)" if from}")
    end

    # The mold that booted the app: the generation stays (its workers are the generation's first).
    def adopt_booted(pid, socket)
      @mold = MoldProcess.new(pid, socket, @generation, true)
      @booting = nil
      @adopted = true
      @boot_failures = 0
      @logger.info("refork: mold of generation #{@generation} is pid #{pid} (it booted the app)")
    end

    # Sends "fork INDEX" with the worker's control pipe and waits for "spawned INDEX PID". A mold that
    # is gone, fails or does not answer in FORK_SECONDS is forgotten (killed if it lives).
    def ask_mold(index, control)
      socket = @mold.socket
      socket.sendmsg("fork #{index}", 0, nil, Socket::AncillaryData.unix_rights(control))
      deadline = now + FORK_SECONDS
      while (left = deadline - now).positive?
        next unless socket.wait_readable(left)

        msg, = socket.recvmsg_nonblock(MESSAGE_MAX, exception: false)
        next if msg == :wait_readable

        verb, at, rest = msg.to_s.split(" ", 3)
        return Integer(rest) if verb == "spawned" && at.to_i == index
        raise IOError, (verb == "failed" ? rest : "the mold closed its socket") if msg.nil? || msg.empty? || verb == "failed"
      end
      raise IOError, "no answer in #{FORK_SECONDS}s"
    rescue IOError, SystemCallError, ArgumentError => e
      @logger.warn("refork: the mold (pid #{@mold.pid}) could not fork worker #{index} (#{e.message}); " \
                   "#{@lean ? 'a new mold boots the app' : 'forking it from the master'}")
      kill_mold
      nil
    end

    def kill_mold
      Process.kill(:KILL, @mold.pid)
    rescue Errno::ESRCH
      nil
    ensure
      forget_mold
    end

    def forget_mold
      @mold.socket.close unless @mold.socket.closed?
      @mold = nil
    end
  end
end
