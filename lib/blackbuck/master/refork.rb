# frozen_string_literal: true

require "socket"
require_relative "children"
require_relative "refork_policy"
require_relative "../messages"

module Blackbuck
  # Reforking (refork_after), in the master. Workers forked from the master start with the heap the
  # master had after boot, and each then warms a private copy of what the app loads lazily (Rails'
  # routes and views, caches, YJIT's code). So once a worker of the current generation has served
  # refork_after[generation] requests, it forks the mold (Worker#promote, Forker#mold_from_worker): it
  # stops serving, its idle connections move to its siblings, it forks the mold and exits, and from
  # then on every new worker forks from the mold and shares its warm pages. The previous generation's workers are then replaced one at a time: each is
  # told to retire (its idle connections move to the others) only once every slot has a serving
  # worker, so the server never has fewer than workers - 1 serving. After the list's last count,
  # the generation stays.
  #
  # The blackbuck command's master does not load the app when reforking: a first mold does
  # (Forker#booting_mold: it loads the app, warms it up, and forks generation 0), so the master holds
  # only Blackbuck, and once a refork replaces that mold, nothing of the app stays in the master
  # that no worker shares. A master given a loaded app (a rack handler's: `rackup`, `rails server`)
  # forks generation 0 itself, as without reforking.
  #
  # What to do next is ReforkPolicy's (from the children's roles and states, and the scoreboard);
  # this object carries it out: it tells workers, hears the molds, asks them for workers, and keeps
  # the molds in the master's Children with their states (booting, serving, stopping).
  #
  # The master never waits for the mold: it asks for a worker (#ask) and goes on with its loop; the
  # answer is read when the mold's socket is readable (#readers, #listen), and the worker joins the
  # master's children then.
  #
  # The mold is never a point of failure: if it dies, or does not answer a fork within
  # FORK_SECONDS, the master forgets it (killing it if it lives) and forks from itself, or, when it
  # does not hold the app, has a serving worker fork a new mold (as a refork does, in the same
  # generation): the new mold runs the code the workers run, never code on disk that no check has
  # passed (a deploy may have replaced the files; only a HUP loads them, once they boot). Only when
  # no worker can (none serves, or the app is not fork-safe, or the one told failed) does a new mold
  # boot the app from disk (BOOT_RETRY_SECONDS apart while boots fail). A first mold that cannot
  # boot the app ends the server, as a config.ru that raises does. An app that says it is no longer
  # fork-safe (Blackbuck.no_longer_fork_safe!) is never reforked: the worker told to fork the mold
  # refuses, and reforking turns off (the mold that booted the app stays the one workers fork from).
  class Refork
    FORK_SECONDS = 5 # seconds the mold may take to answer a fork; then it is killed and replaced

    # A fork asked of the mold and not answered yet: the write end of the worker's control pipe,
    # and when the master stops waiting.
    Ask = Struct.new(:control, :deadline)

    # counts: config[:refork_after]; children: the master's Children (the molds join them);
    # subreaper: makes this process the child subreaper, true when it is (unit tests pass their own:
    # the test process stays as it is).
    def initialize(counts, children:, scoreboard:, logger:, subreaper: -> { Native.child_subreaper })
      @children = children
      @logger = logger
      @policy = ReforkPolicy.new(counts, scoreboard)
      @counts = counts
      @scoreboard = scoreboard
      @on = !counts.empty? && subreaper?(subreaper)
      @cannot_boot = nil  # why the first boot failed, for the master to end the server with (#take_boot_failure)
      @asks = {}          # slot index => Ask, sent to the mold, until it answers or FORK_SECONDS pass
      # Molds announce themselves here, and workers that must not be forked say so (one end each way:
      # every worker may be told to fork the mold, so every worker inherits the line).
      @inbox, @line = Socket.pair(:UNIX, :SEQPACKET) if @on
    end

    def on? = @on

    # The refork generation: the workers the current mold forks belong to it.
    def generation = @policy.generation

    # The mold workers fork from (a Children::MoldChild), or nil.
    def mold = @children.mold

    # The announcement line's sending end, for the workers (Worker#promote, Mold#run); nil when off.
    attr_reader :line

    # The master's sockets to watch: announcements, and the mold's socket while a fork is asked.
    def readers
      return [] unless @on

      mold && !@asks.empty? ? [@inbox, mold.socket] : [@inbox]
    end

    # In a process the master forks: the master's ends are not its own (the molds' sockets are
    # closed with the children's: Children#close_in_child).
    def close_in_child
      @inbox&.close unless @inbox.nil? || @inbox.closed?
      @asks.each_value { |ask| ask.control.close unless ask.control.closed? }
    end

    # What the master hears, never waiting: announcements, the mold's answers (each worker it forked
    # joins the children), and a mold that did not answer within FORK_SECONDS (killed). Each turn of
    # the loop, and while a HUP's boot check runs.
    def listen
      return unless @on

      read_inbox
      read_answers
      expire_asks
    end

    # One turn of the master's loop: #listen, then at most one step (ReforkPolicy#next_step). wanted:
    # the worker count; quiet: no refork step now (a HUP's handover, a stop).
    def turn(wanted, quiet: false)
      return unless @on

      listen
      step = @policy.next_step(@children, wanted, quiet: quiet)
      send(step.action, step.child) if step
    end

    # Asks the mold for the worker of slot index (with its control pipe); the worker joins the
    # master's children when the answer comes (#listen). False when there is no mold (then the
    # master forks it itself, or a mold is made).
    def ask(index)
      return false unless (mold = self.mold)
      return true if @asks.key?(index)

      control_r, control_w = IO.pipe
      begin
        Messages.send_datagram_nonblock(mold.socket, Messages::SpawnRequest.new(index, control_r))
      rescue IOError, SystemCallError => e # (EAGAIN too: a mold whose socket is that full is stuck)
        control_w.close
        mold_failed(index, e.message)
        return false
      ensure
        control_r.close
      end
      @asks[index] = Ask.new(control_w, now + FORK_SECONDS)
      true
    end

    # Whether the mold was asked for slot index and has not answered yet.
    def asked?(index) = @asks.key?(index)

    # Whether the master may start a mold that boots the app now (ReforkPolicy#boot_due?), the
    # first boot not having failed.
    def boot_due? = @on && @cannot_boot.nil? && @policy.boot_due?(@children, now)

    # Whether the master holds no app and the mold's workers run the code it serves (they forked from
    # a mold that booted it): a mold that dies is replaced by one a worker forks.
    def lean? = @policy.lean?

    # The master forked pid to boot the app and then run as the mold (Forker#booting_mold).
    def booting(pid)
      @children.add_mold(Children::MoldChild.new(pid, nil, generation, true, :booting))
      @policy.lean!
      @logger.info("refork: mold (pid #{pid}) is booting the app; workers fork from it")
    end

    # Why the first mold could not boot the app (the server cannot start), once; else nil.
    def take_boot_failure
      why = @cannot_boot
      @cannot_boot = nil if why
      why
    end

    # A worker has exited (Children#reap): one told to fork the mold ends its promotion; one that was to
    # replace the mold that died and did not is logged (another is told, or a mold boots the app). Its
    # mold's announcement is read first: the worker exits once its mold has announced itself, so the
    # master may reap it before it read the line, and that mold is adopted (in the same generation
    # when it replaces one), not counted as missing.
    def worker_exited(child)
      return unless @on && child.state == :promoting

      read_inbox
      return unless @policy.promotion_ended(mold: !mold.nil?)

      @logger.warn("refork: worker #{child.index} (pid #{child.pid}) exited without forking a mold; " \
                   "#{@policy.successor == :worker ? 'another is told' : 'a new mold boots the app'}")
    end

    # A child of the master's that is not a worker has exited: a mold (Children forgot it), a worker
    # the mold forked whose answer was not read yet (returned, a Children::Child: the master treats
    # its exit as any worker's), or another child (a HUP's boot check, whose exit is said elsewhere).
    # why: what it said before it died.
    def reaped(pid, status, mold = nil, why = nil)
      how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
      case mold&.state
      when :booting then boot_failed(pid, how, why)
      when :serving
        @logger.warn("mold (pid #{pid}, generation #{mold.generation}) #{how}; workers fork from " \
                     "#{successor} until the next refork")
        forget(mold)
      when :stopping then @logger.info("previous mold (pid #{pid}) #{how}")
      else
        # (the mold's middle process says the pid before it exits, so the answer is there to read)
        read_answers unless @asks.empty?
        @children.delete(pid)
      end
    end

    # The server stops, or HUP replaces the code: the mold goes (its workers stay until told), and
    # so does one still booting the app.
    def stop_mold(why)
      if (booting = @children.booting_mold)
        @logger.info("mold (pid #{booting.pid}) booting the app stopping: #{why}")
        stop(booting, :TERM)
      end
      return unless (mold = self.mold)

      @logger.info("mold (pid #{mold.pid}) stopping: #{why}")
      stop(mold, :TERM)
    end

    # For /status: the refork generation, the mold (pid, generation, whether it booted the app) or
    # nil, and the pid of a mold still booting the app, or nil.
    def status
      mold = self.mold
      mold &&= { "pid" => mold.pid, "generation" => mold.generation, "booted_app" => mold.booted }
      { "generation" => generation, "mold" => mold, "booting" => @children.booting_mold&.pid }
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # Where workers come from once the mold is gone, for the log.
    def successor
      case @policy.successor
      when :master then "the master"
      when :boot then "a new mold that boots the app"
      else "a new mold a worker forks (the code they run, not what is on disk)"
      end
    end

    # The mold is gone: a serving worker forks the next, which keeps the generation (ReforkPolicy).
    def replace(child)
      @logger.info("refork: worker #{child.index} (pid #{child.pid}) forks a mold in place of the one that is gone " \
                   "(generation #{generation} stays)")
      @children.tell_stop(child, Messages::PROMOTE)
    end

    def promote(child)
      requests = @scoreboard.read(child.index).requests
      @logger.info("refork: worker #{child.index} (pid #{child.pid}) served #{requests} requests " \
                   "(refork_after #{@counts[generation]}); it forks the mold of generation #{generation + 1}")
      @children.tell_stop(child, Messages::PROMOTE)
    end

    def retire(child)
      @logger.info("refork: replacing worker #{child.index} (pid #{child.pid}, generation #{child.generation}) " \
                   "with one of generation #{generation}")
      @children.tell_stop(child, Messages::RETIRE)
    end

    # The mold booting the app died before it could fork: the first time, the server cannot start;
    # once the app has booted, a new one is tried a little later (ReforkPolicy#boot_failed).
    def boot_failed(pid, how, why)
      unless (wait = @policy.boot_failed(now))
        @cannot_boot = why || "the mold (pid #{pid}) booting the app #{how}"
        return
      end
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

    # The announcements (Messages): MoldReady from the promoted worker's mold, with its own socket
    # (the worker exits now, and its slot goes to the mold's first worker once it is reaped), or
    # from the mold that booted the app; Unsafe: the worker must not be forked, and reforking ends.
    def read_inbox
      loop do
        case (message = Messages.receive_nonblock(@inbox))
        when :wait_readable, nil then return
        when Messages::MoldReady then adopt_mold(message)
        when Messages::Unsafe
          @logger.warn("refork: worker #{@children[message.pid]&.index} (pid #{message.pid}) is not fork-safe " \
                       "(#{message.why}); reforking is off")
          @policy.unsafe
          @children.serves_on(message.pid)
        else
          @logger.warn("refork: not an announcement, ignored: #{message.inspect}")
        end
      end
    end

    # ready: its pid and socket, and the worker that forked it (worker_pid and index; nil for the
    # mold that booted the app)
    def adopt_mold(ready)
      pid = ready.pid
      booting = @children.booting_mold
      return adopt_booted(booting, ready.socket) if booting&.pid == pid

      stop_mold("generation #{generation + 1} has a mold") if mold
      replaced = @policy.adopted(booted: false)
      @children.add_mold(Children::MoldChild.new(pid, ready.socket, generation, false, :serving))
      from = ready.worker_pid
      @children.leaving(from) if from # until it is reaped
      @logger.info("refork: mold of generation #{generation} is pid #{pid}" \
                   "#{" (forked by worker #{ready.index}, pid #{from}, which exits)" if from}" \
                   "#{'; it replaces the mold that is gone' if replaced}")
    end

    # The mold that booted the app: the generation stays (its workers are the generation's first).
    def adopt_booted(mold, socket)
      mold.socket = socket
      mold.generation = generation
      mold.state = :serving
      @policy.adopted(booted: true)
      @logger.info("refork: mold of generation #{generation} is pid #{mold.pid} (it booted the app)")
    end

    # The mold's answers (Messages), without waiting: Spawned (the worker joins the children),
    # SpawnFailed, or its socket closed: a mold that fails is killed, and so is one whose answer
    # cannot be read.
    def read_answers
      return if (mold = self.mold).nil? || @asks.empty?

      loop do
        case (answer = Messages.receive_nonblock(mold.socket))
        when :wait_readable then return
        when nil then return mold_failed(@asks.keys.first, "the mold closed its socket")
        when Messages::SpawnFailed then return mold_failed(answer.index, answer.why)
        when Messages::Spawned
          next unless (ask = @asks.delete(answer.index)) # (no such ask: nothing to do)

          @children.add(Children::Child.new(answer.index, answer.pid, ask.control, now, false, mold.generation, :mold))
        else return mold_failed(@asks.keys.first, "not an answer: #{answer.inspect}")
        end
      end
    rescue IOError, SystemCallError => e
      mold_failed(@asks.keys.first, e.message)
    end

    # A fork asked FORK_SECONDS ago and not answered: the mold is stuck (stopped, or in a hook that
    # hangs).
    def expire_asks
      late, = @asks.find { |_, ask| now >= ask.deadline }
      mold_failed(late, "no answer in #{FORK_SECONDS}s") if late
    end

    # The mold could not fork the worker of slot index: it is killed and forgotten, with every fork
    # still asked of it (the loop asks again: the master forks, or a new mold is made).
    def mold_failed(index, why)
      mold = self.mold
      @logger.warn("refork: the mold (pid #{mold.pid}) could not fork worker #{index} (#{why}); " \
                   "#{lean? ? 'a new mold takes its place' : 'forking it from the master'}")
      stop(mold, :KILL)
    end

    # Signals the mold and forgets it as the mold: it stays among the children, :stopping, until
    # it is reaped.
    def stop(mold, sig)
      Process.kill(sig, mold.pid)
    rescue Errno::ESRCH
      nil
    ensure
      forget(mold)
      mold.state = :stopping
    end

    # The forks still asked of it are dropped: their control pipes close (a worker it forked whose
    # answer never came sees its master gone, and stops).
    def forget(mold)
      mold.socket.close unless mold.socket.nil? || mold.socket.closed?
      return if mold.state == :booting

      @asks.each_value { |ask| ask.control.close unless ask.control.closed? }
      @asks.clear
      @policy.mold_lost
    end
  end
end
