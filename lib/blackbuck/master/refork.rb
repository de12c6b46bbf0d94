# frozen_string_literal: true

require "socket"
require_relative "children"
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
    BOOT_RETRY_SECONDS = [1, 2, 5, 10, 30].freeze # after a mold that booted the app failed once it served
    REPLACE_ATTEMPTS = 3 # workers in a row told to fork a mold in place of one that died and exiting
                         # without (one was already stopping), after which a mold boots the app from disk

    # What the master knows of the mold: its pid, the socket it listens on, its generation (the
    # workers it forks belong to it), and its USS when status asks.
    MoldProcess = Struct.new(:pid, :socket, :generation, :booted)

    # A fork asked of the mold and not answered yet: the write end of the worker's control pipe,
    # and when the master stops waiting.
    Ask = Struct.new(:control, :deadline)

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
      @promoting = nil # the Child told to fork the mold, until the mold announces itself or the worker exits
      @retiring = nil  # pid of the previous generation's worker told to retire, until it exits
      @leaving = nil   # pid of the worker that forked the mold, until it exits
      @on = !counts.empty? && subreaper?(subreaper)
      @promoting_on = @on # false once a worker said the app is not fork-safe
      @booting = nil      # pid of the mold loading the app (Forker#booting_mold), until it announces itself
      @boot_failure = nil # why the first boot failed, for the master to end the server with
      @boot_failures = 0  # in a row, since the last mold that booted
      @boot_after = 0     # monotonic time before which no new boot is tried
      @adopted = false    # a mold that booted the app has announced itself once: the app boots
      @lean = false       # the master does not hold the app (a mold boots it)
      @asks = {}          # slot index => Ask, sent to the mold, until it answers or FORK_SECONDS pass
      @arrived = {}       # pid => Children::Child the mold forked, until the master's children take it
      @replacing = false  # the promoted worker forks a mold in place of one that died (same generation)
      @replace_failures = 0 # such workers that exited without a mold, in a row (REPLACE_ATTEMPTS)
      @none_to_fork = false # since the mold was lost, a turn found no serving worker to fork the next
      # Molds announce themselves here, and workers that must not be forked say so (one end each way:
      # every worker may be told to fork the mold, so every worker inherits the line).
      @inbox, @line = Socket.pair(:UNIX, :SEQPACKET) if @on
    end

    def on? = @on

    # Whether workers are still made molds: false once one said the app is not fork-safe (the mold
    # machinery stays on: a mold that booted the app goes on forking the workers).
    def reforking? = @promoting_on

    # The announcement line's sending end, for the workers (Worker#promote, Mold#run); nil when off.
    attr_reader :line

    # The master's sockets to watch: announcements, and the mold's socket while a fork is asked.
    def readers
      return [] unless @on

      @mold && !@asks.empty? ? [@inbox, @mold.socket] : [@inbox]
    end

    # In a process the master forks: the master's ends are not its own.
    def close_in_child
      @inbox&.close unless @inbox.nil? || @inbox.closed?
      @mold&.socket&.close unless @mold.nil? || @mold.socket.closed?
      (@asks.values.map(&:control) + @arrived.values.map(&:control)).each { |io| io.close unless io.closed? }
    end

    # What the master hears, never waiting: announcements, the mold's answers (each worker it forked
    # joins children), and a mold that did not answer within FORK_SECONDS (killed). Each turn of the
    # loop, and while a HUP's boot check runs.
    def listen(children)
      return unless @on

      read_inbox(children)
      read_answers
      expire_asks
      @arrived.each_value { |child| children.add(child) }
      @arrived.clear
    end

    # One turn of the master's loop: #listen, then at most one step: a promotion in place of a mold
    # that died, a retirement of a previous generation's worker, or a promotion. wanted: the worker
    # count; quiet: no refork step now (a HUP's handover, a stop).
    def turn(children, wanted, quiet: false)
      return unless @on

      listen(children)
      return unless @promoting_on # (a worker just said the app is not fork-safe)

      promotion_ended if @promoting && children[@promoting.pid].nil?
      @retiring = nil if @retiring && children[@retiring].nil?
      @leaving = nil if @leaving && children[@leaving].nil?
      return if @promoting
      return replace_mold(children) if replace_mold? # (a retirement under way waits: no worker is forked meanwhile)
      return if quiet || @retiring || @leaving || !children.all_started?(wanted)

      if (old = children.find { |c| c.generation < @generation })
        retire(children, old)
      elsif (chosen = due(children))
        promote(children, chosen)
      end
    end

    # Asks the mold for the worker of slot index (with its control pipe); the worker joins the
    # master's children when the answer comes (#listen). False when there is no mold (then the
    # master forks it itself, or a mold is made).
    def ask(index)
      return false unless @mold
      return true if @asks.key?(index)

      control_r, control_w = IO.pipe
      begin
        Messages.send_datagram_nonblock(@mold.socket, Messages::SpawnRequest.new(index, control_r))
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

    # Whether the master may start a mold that boots the app now: none is booting, none is there, no
    # worker is forking one or can (#replace_mold), and the last failed boot is BOOT_RETRY_SECONDS old.
    def boot_due?
      @on && @booting.nil? && @mold.nil? && @promoting.nil? && (@none_to_fork || !replace_possible?) &&
        @boot_failure.nil? && now >= @boot_after
    end

    # Whether the master holds no app and the mold's workers run the code it serves (they forked from
    # a mold that booted it): a mold that dies is replaced by one a worker forks (#replace_mold).
    def lean? = @lean

    # The master forked pid to boot the app and then run as the mold (Forker#booting_mold).
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

    # A child of the master's that is not a worker has exited: the mold, a previous one, a worker the
    # mold forked whose answer was not read yet (returned, a Children::Child: the master treats its
    # exit as any worker's), or another child (a HUP's boot check, whose exit is said elsewhere).
    # why: what it said before it died.
    def reaped(pid, status, why = nil)
      how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
      if @booting == pid
        boot_failed(pid, how, why)
      elsif @mold&.pid == pid
        @logger.warn("mold (pid #{pid}, generation #{@mold.generation}) #{how}; workers fork from " \
                     "#{successor} until the next refork")
        forget_mold
      elsif @stopped_molds.delete(pid)
        @logger.info("previous mold (pid #{pid}) #{how}")
      else
        # (the mold's middle process says the pid before it exits, so the answer is there to read)
        read_answers unless @asks.empty?
        @arrived.delete(pid)
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

    # Where workers come from once the mold is gone, for the log.
    def successor
      return "the master" unless @lean
      return "a new mold that boots the app" unless replace_possible?

      "a new mold a worker forks (the code they run, not what is on disk)"
    end

    # A new mold can be forked by a worker, in place of the mold that died: the master holds no app,
    # the app booted in this image, and no worker has refused or failed to.
    def replace_possible? = @lean && @adopted && @promoting_on && @replace_failures < REPLACE_ATTEMPTS

    def replace_mold? = @mold.nil? && @booting.nil? && replace_possible?

    # The mold is gone: a serving worker (of the current generation if one serves; not one that is
    # stopping) forks the next, which keeps the generation. None serving: a mold boots the app when
    # one is needed (#boot_due?).
    def replace_mold(children)
      serving = children.select { |c| children.started?(c) && @scoreboard.read(c.index).state != Native::Scoreboard::STOPPING }
      chosen = serving.find { |c| c.generation == @generation } || serving.first
      return @none_to_fork = true unless chosen

      @logger.info("refork: worker #{chosen.index} (pid #{chosen.pid}) forks a mold in place of the one that is gone " \
                   "(generation #{@generation} stays)")
      @promoting = chosen
      @replacing = true
      children.tell_stop(chosen, Messages::PROMOTE)
    end

    # The worker told to fork the mold has exited without it announcing itself.
    def promotion_ended
      if @replacing && @mold.nil?
        @replace_failures += 1
        @logger.warn("refork: worker #{@promoting.index} (pid #{@promoting.pid}) exited without forking a mold; " \
                     "#{replace_possible? ? 'another is told' : 'a new mold boots the app'}")
      end
      @promoting = nil
      @replacing = false
    end

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

      children.find { |c| c.generation == @generation && @scoreboard.read(c.index).requests >= count }
    end

    def promote(children, child)
      requests = @scoreboard.read(child.index).requests
      @logger.info("refork: worker #{child.index} (pid #{child.pid}) served #{requests} requests " \
                   "(refork_after #{@counts[@generation]}); it forks the mold of generation #{@generation + 1}")
      @promoting = child
      children.tell_stop(child, Messages::PROMOTE)
    end

    def retire(children, child)
      @logger.info("refork: replacing worker #{child.index} (pid #{child.pid}, generation #{child.generation}) " \
                   "with one of generation #{@generation}")
      @retiring = child.pid
      children.tell_stop(child, Messages::RETIRE)
    end

    # The announcements (Messages): MoldReady from the promoted worker's mold, with its own socket
    # (the worker exits now, and its slot goes to the mold's first worker once it is reaped), or
    # from the mold that booted the app; Unsafe: the worker must not be forked, and reforking ends.
    def read_inbox(children)
      loop do
        case (message = Messages.receive_nonblock(@inbox))
        when :wait_readable, nil then return
        when Messages::MoldReady then adopt_mold(children, message)
        when Messages::Unsafe
          @logger.warn("refork: worker #{children[message.pid]&.index} (pid #{message.pid}) is not fork-safe " \
                       "(#{message.why}); reforking is off")
          @promoting_on = false
          @promoting = nil
          @replacing = false
        else
          @logger.warn("refork: not an announcement, ignored: #{message.inspect}")
        end
      end
    end

    # ready: its worker_pid and index, the worker that forked it (nil for the mold that booted the app)
    def adopt_mold(children, ready)
      pid = ready.pid
      from = ready.worker_pid
      return adopt_booted(pid, ready.socket) if pid == @booting

      stop_mold("generation #{@generation + 1} has a mold") if @mold
      replaced = @replacing && @mold.nil?
      @generation += 1 unless replaced
      @mold = MoldProcess.new(pid, ready.socket, @generation, false)
      @promoting = nil
      @replacing = false
      @replace_failures = 0
      @leaving = from if from && children[from] # until it is reaped
      @logger.info("refork: mold of generation #{@generation} is pid #{pid}" \
                   "#{" (forked by worker #{ready.index}, pid #{from}, which exits)" if from}" \
                   "#{'; it replaces the mold that is gone' if replaced}")
    end

    # The mold that booted the app: the generation stays (its workers are the generation's first).
    def adopt_booted(pid, socket)
      @mold = MoldProcess.new(pid, socket, @generation, true)
      @booting = nil
      @adopted = true
      @boot_failures = 0
      @replace_failures = 0
      @logger.info("refork: mold of generation #{@generation} is pid #{pid} (it booted the app)")
    end

    # The mold's answers (Messages), without waiting: Spawned (the worker joins the children at the
    # next #listen), SpawnFailed, or its socket closed: a mold that fails is killed, and so is one
    # whose answer cannot be read.
    def read_answers
      return if @mold.nil? || @asks.empty?

      loop do
        case (answer = Messages.receive_nonblock(@mold.socket))
        when :wait_readable then return
        when nil then return mold_failed(@asks.keys.first, "the mold closed its socket")
        when Messages::SpawnFailed then return mold_failed(answer.index, answer.why)
        when Messages::Spawned
          next unless (ask = @asks.delete(answer.index)) # (no such ask: nothing to do)

          @arrived[answer.pid] = Children::Child.new(answer.index, answer.pid, ask.control, now, false,
                                                     @mold.generation, :mold)
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
      @logger.warn("refork: the mold (pid #{@mold.pid}) could not fork worker #{index} (#{why}); " \
                   "#{@lean ? 'a new mold takes its place' : 'forking it from the master'}")
      kill_mold
    end

    def kill_mold
      Process.kill(:KILL, @mold.pid)
      @stopped_molds << @mold.pid
    rescue Errno::ESRCH
      nil
    ensure
      forget_mold
    end

    # The forks still asked of it are dropped: their control pipes close (a worker it forked whose
    # answer never came sees its master gone, and stops).
    def forget_mold
      @mold.socket.close unless @mold.socket.closed?
      @asks.each_value { |ask| ask.control.close unless ask.control.closed? }
      @asks.clear
      @mold = nil
      @none_to_fork = false
    end
  end
end
