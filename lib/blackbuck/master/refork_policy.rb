# frozen_string_literal: true

module Blackbuck
  # What reforking does next, decided from the master's children (Children: roles and states) and
  # the scoreboard's request counts, with the back-off for molds that fail. It holds no socket,
  # sends no message or signal and logs nothing: Refork carries its steps out and tells it what
  # happened (#adopted, #boot_failed, #unsafe, #mold_lost). Its tests need no fork.
  class ReforkPolicy
    BOOT_RETRY_SECONDS = [1, 2, 5, 10, 30].freeze # after a mold that booted the app failed once it served
    REPLACE_ATTEMPTS = 3 # workers in a row told to fork a mold in place of one that died and exiting
                         # without (one was already stopping), after which a mold boots the app from disk

    # One step: :promote (the child forks the next generation's mold), :retire (the child, of a
    # previous generation, makes room for one of this one), :replace (the child forks a mold in
    # place of the one that died; the generation stays).
    Step = Struct.new(:action, :child)

    # generation: the workers the current mold forks belong to it; reforking: workers are still
    # made molds (false once one said the app is not fork-safe); lean: the master does not hold the
    # app (a mold boots it); replace_failures: workers told to replace the mold that exited without.
    attr_reader :generation, :replace_failures

    # counts: refork_after (the requests a worker of each generation serves before it forks the next
    # mold); scoreboard: the slots' numbers (#read).
    def initialize(counts, scoreboard)
      @counts = counts
      @scoreboard = scoreboard
      @generation = 0
      @reforking = true
      @lean = false
      @adopted = false       # a mold that booted the app has announced itself once: the app boots
      @boot_failures = 0     # in a row, since the last mold that booted
      @boot_after = 0        # monotonic time before which no new boot is tried
      @replacing = false     # the promoted worker forks a mold in place of one that died
      @replace_failures = 0
      @none_to_fork = false  # since the mold was lost, a turn found no serving worker to fork the next
    end

    def reforking? = @reforking
    def lean? = @lean

    # The master does not hold the app: a mold boots it.
    def lean! = @lean = true

    # The next step, or nil. wanted: the worker count; quiet: no refork step now (a HUP's handover,
    # a stop). Only one step is under way at a time: a worker promoting, retiring or leaving waits it.
    def next_step(children, wanted, quiet:)
      return unless @reforking

      return if children.in_state(:promoting)
      return replacement(children) if replace?(children)
      return if quiet || children.in_state(:retiring) || children.in_state(:leaving) || !children.all_started?(wanted)

      if (old = children.find { |c| c.generation < @generation })
        Step.new(:retire, old)
      elsif (chosen = due(children))
        Step.new(:promote, chosen)
      end
    end

    # Whether a mold that boots the app may start now: none is booting, none is there, no worker is
    # forking one or can (#replace?), and the last failed boot is BOOT_RETRY_SECONDS old.
    def boot_due?(children, now)
      children.booting_mold.nil? && children.mold.nil? && children.in_state(:promoting).nil? &&
        (@none_to_fork || !replace_possible?) && now >= @boot_after
    end

    # A mold has announced itself. booted: it loaded the app (the generation stays: its workers are
    # the generation's first); else a worker forked it: the next generation, or the same one when it
    # replaces a mold that died. Returns whether it replaces one.
    def adopted(booted:)
      @replace_failures = 0
      if booted
        @adopted = true
        @boot_failures = 0
        return false
      end
      replaced = @replacing
      @generation += 1 unless replaced
      @replacing = false
      replaced
    end

    # The mold booting the app died before it could fork. Returns nil the first time (the server
    # cannot start), else the seconds before the next boot is tried.
    def boot_failed(now)
      return unless @adopted

      wait = BOOT_RETRY_SECONDS[@boot_failures] || BOOT_RETRY_SECONDS.last
      @boot_failures += 1
      @boot_after = now + wait
      wait
    end

    # The worker told to fork the mold has exited. Returns whether it was to replace the mold that
    # died and did not (mold: there is one now), which counts towards REPLACE_ATTEMPTS.
    def promotion_ended(mold:)
      return false unless @replacing

      @replacing = false
      return false if mold

      @replace_failures += 1
      true
    end

    # A worker said the app is not fork-safe: no worker is made a mold again.
    def unsafe
      @reforking = false
      @replacing = false
    end

    # The mold is gone (died, killed, stopped).
    def mold_lost = @none_to_fork = false

    # Who forks the workers once the mold is gone, for the log: :master, :worker (a new mold a
    # worker forks) or :boot (a new mold that boots the app).
    def successor
      return :master unless @lean

      replace_possible? ? :worker : :boot
    end

    private

    # A new mold can be forked by a worker, in place of the mold that died: the master holds no app,
    # the app booted in this image, and no worker has refused or failed to.
    def replace_possible? = @lean && @adopted && @reforking && @replace_failures < REPLACE_ATTEMPTS

    def replace?(children) = children.mold.nil? && children.booting_mold.nil? && replace_possible?

    # A serving worker (of the current generation if one serves; not one that is stopping) forks the
    # next mold. None serving: a mold boots the app when one is needed (#boot_due?).
    def replacement(children)
      serving = children.select do |c|
        children.started?(c) && c.state == :serving && @scoreboard.read(c.index).state != Native::Scoreboard::STOPPING
      end
      chosen = serving.find { |c| c.generation == @generation } || serving.first
      unless chosen
        @none_to_fork = true
        return
      end

      @replacing = true
      Step.new(:replace, chosen)
    end

    # The worker of the current generation that has served its count, if any (the list not exhausted).
    def due(children)
      count = @counts[@generation]
      return unless count

      children.find { |c| c.generation == @generation && @scoreboard.read(c.index).requests >= count }
    end
  end
end
