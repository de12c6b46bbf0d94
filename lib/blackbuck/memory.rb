# frozen_string_literal: true

require "etc"

module Blackbuck
  # A worker's memory between requests: max_memory_per_child (its USS, looked at after requests and
  # on ticks) and out-of-band GC (oob_gc, oob_gc_auto, oob_major_gc: a collection between requests
  # rather than inside one). The worker asks; it decides when to stop and when the loop is idle
  # enough to GC.
  #
  # The limit counts USS, the pages only this worker maps (Private_Clean + Private_Dirty in
  # smaps_rollup): what the worker alone costs, what the machine gets back when it exits. RSS also
  # counts the copy-on-write pages it still shares with the master and its siblings (the preloaded
  # app), so a worker of a big app would be over an RSS limit from birth while costing little.
  class Memory
    PAGE_KIB = Etc.sysconf(Etc::SC_PAGESIZE) / 1024
    CHECK_SECONDS = 0.01      # memory is looked at no more often than this while requests are served
    USS_COST_SHARE = 0.01     # share of a worker's time that re-reading USS may take (#uss_due?)
    OOB_GC_FREE_SLOTS = 0.1   # fraction of live slots: fewer free slots than this and a GC is near
    OOB_GC_MIN_SLOTS = 1_000  # a size pool with fewer live slots than this is not watched
    OOB_GC_MALLOC = 0.9       # fraction of the malloc limit that counts as near
    # oob_major_gc: how long a major GC Ruby asked for may wait for an idle moment (a worker that never
    # has one: every turn of its loop finds a request waiting). Past either bound Ruby's own major GCs
    # are allowed again until one has run (#major_due?): the heap grows in the meantime (Ruby adds
    # pages where it would have run the major), and never without bound.
    OOB_MAJOR_GC_WAIT_REQUESTS = 1_000 # requests served since the major was first seen due
    OOB_MAJOR_GC_WAIT_SECONDS = 5      # seconds since then

    # Can this Ruby's GC be told to run no major GC by itself and to say when one is due (oob_major_gc)?
    # Ruby >= 3.4 with its default GC: GC.config(rgengc_allow_full_mark:), GC.latest_gc_info(:need_major_by).
    def self.major_gc_control?(gc = ::GC)
      gc.respond_to?(:config) && gc.config.key?(:rgengc_allow_full_mark) && gc.latest_gc_info.key?(:need_major_by)
    end

    # Why oob_major_gc cannot be had here (a ConfigError's text), or nil when it can.
    def self.major_gc_unsupported(gc = ::GC)
      return nil if major_gc_control?(gc)

      impl = gc.respond_to?(:config) ? " with the #{gc.config[:implementation]} GC" : ""
      "oob_major_gc needs GC.config(rgengc_allow_full_mark:) (Ruby >= 3.4 with its default GC); " \
        "Ruby #{RUBY_VERSION}#{impl} has none: remove the setting (oob_gc_auto works on any Ruby)"
    end

    # What max_memory_per_child counts here: :uss (Linux >= 4.14), :rss (an older kernel) or nil (no
    # /proc: the limit is not enforced). proc: the process's /proc directory (tests pass a fake one).
    def self.measure(proc = "/proc/self")
      if File.readable?("#{proc}/smaps_rollup") then :uss
      elsif File.readable?("#{proc}/statm") then :rss
      end
    end

    # What a process costs, for /status: {"uss_kib", "pss_kib", "rss_kib"} from its smaps_rollup
    # (USS: its private pages; PSS: its share of every page it maps), or nil where it cannot be read
    # (gone, Linux < 4.14). 1-3 ms per process: read when asked, never on a request's path.
    def self.usage(pid, proc_root = "/proc")
      s = File.read("#{proc_root}/#{pid}/smaps_rollup")
      kib = ->(field) { s[/^#{field}:\s*(\d+)/, 1].to_i }
      { "uss_kib" => kib.("Private_Clean") + kib.("Private_Dirty"), "pss_kib" => kib.("Pss"), "rss_kib" => kib.("Rss") }
    rescue SystemCallError, IOError
      nil
    end

    # The master's boot line with max_memory_per_child set, so the log says once what is counted.
    def self.describe(limit_kib, proc = "/proc/self")
      case measure(proc)
      when :uss then "max_memory_per_child #{limit_kib} KiB of USS (a worker's private pages, from smaps_rollup)"
      when :rss then "max_memory_per_child #{limit_kib} KiB of RSS (no smaps_rollup here, Linux < 4.14: " \
                     "pages shared with the master count too)"
      else "max_memory_per_child #{limit_kib} KiB is not enforced: no /proc here"
      end
    end

    attr_reader :limit_kib # max_memory_per_child, KiB (0: none)
    attr_reader :measure   # what the limit counts: :uss, or :rss without smaps_rollup (Memory.measure)

    # gc: the GC (tests pass a stand-in); clock: monotonic seconds (oob_major_gc's wait).
    def initialize(config, proc: "/proc/self", gc: ::GC, clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) })
      @oob_gc = config[:oob_gc]
      @oob_gc_auto = config[:oob_gc_auto]
      @oob_major_gc = config[:oob_major_gc]
      @gc = gc
      @clock = clock
      @major_wanted = nil    # oob_major_gc: [requests served, seconds] when a major GC was first seen due, until none is
      @full_marks_back = nil # ... and major_gc_count when the wait ran out (Ruby's own majors allowed), until one has run
      @limit_kib = config[:max_memory_per_child]
      @proc = proc
      @measure = @limit_kib.positive? ? Memory.measure(proc) : nil
      @limit_kib = 0 unless @measure # nothing to read: nothing to check
      @check_at = 0.0 # when memory is looked at next after a request (#check_due?)
      @uss = nil      # the last USS read, KiB, ...
      @uss_rss = 0    # ... the RSS read just before it, KiB ...
      @uss_at = 0.0   # ... and when USS is re-read even if RSS has not grown (#uss_due?)
      # oob_gc_auto: each size pool's allocations counted at the last look (#gc_near?). Ruby >= 3.2
      # has one heap per slot size (GC.stat_heap); 3.1 one heap.
      @pools = @gc.respond_to?(:stat_heap) ? @gc.stat_heap.size : 0
      @allocated = Array.new([@pools, 1].max, nil)
    end

    # In the worker, before its first request (Worker#run). With oob_major_gc, Ruby's GC runs no
    # major collection by itself from now on: where it would, it adds heap pages and flags one
    # (GC.latest_gc_info(:need_major_by)), which #collect runs between requests. Nor do its own
    # minor collections promote objects any more (Ruby's Feature #20443): what is old is what the
    # worker was forked with (gc_before_fork made the app's boot old) and what survives a major.
    # The setting is process state, inherited by a fork: only workers have it (never the master).
    def start
      @gc.config(rgengc_allow_full_mark: false) if @oob_major_gc
    end

    # In the worker, once its loop is done: Ruby's own major GCs again. Nothing runs one between
    # requests any more, and the mold a worker forks from here (refork_after) serves none.
    def stop
      @gc.config(rgengc_allow_full_mark: true) if @oob_major_gc
    end

    # Whether a request served has anything to do here at all.
    def per_request? = @oob_gc.positive? || @oob_gc_auto || @oob_major_gc || @limit_kib.positive?

    # After the served-th request: is a GC due between requests (every oob_gc requests, with
    # oob_gc_auto when the next allocations would trigger one anyway, with oob_major_gc when Ruby
    # says a major one is due)? Each is looked at every time: gc_near? and major_due? keep count.
    def gc_due?(served)
      major = @oob_major_gc && major_due?(served)
      (@oob_gc.positive? && (served % @oob_gc).zero?) || (@oob_gc_auto && gc_near?) || major
    end

    # After a request at `now`: is memory to be looked at (CHECK_SECONDS apart at most)?
    def check_due?(now) = @limit_kib.positive? && now >= @check_at

    # USS in KiB (RSS without smaps_rollup) when it is over max_memory_per_child, else nil. At `now`.
    #
    # statm (RSS) costs ~10 us to read; smaps_rollup 1 ms for a 100 MB Ruby process and 2-2.7 ms
    # for a forked one of 100-150 MB sharing most of its pages (measured 2026-11-26, 2 busy cores),
    # as the kernel walks every page table to sort shared pages from private ones. So RSS comes first.
    # Every page counted in USS is resident and counted in RSS too (smaps' Rss is the sum of
    # Shared_Clean, Shared_Dirty, Private_Clean and Private_Dirty), so USS <= RSS, and a worker under
    # the limit by RSS is under it by USS: the common case reads statm alone. (statm's count comes
    # from counters the kernel batches per CPU, a few pages behind at most: seen that much later.)
    def over_limit(now)
      return if @limit_kib.zero?

      @check_at = now + CHECK_SECONDS
      rss = read_kib("statm") { |s| s.split[1].to_i * PAGE_KIB }
      return if rss <= @limit_kib
      return rss if @measure == :rss
      return unless uss_due?(now, rss)

      uss = read_uss(now, rss)
      uss if uss > @limit_kib
    rescue SystemCallError
      @limit_kib = 0 # /proc went away: nothing to check
      nil
    end

    # Between requests, and only when no client is waiting: every oob_gc requests a full GC, with
    # oob_major_gc one when Ruby says a major is due, else (oob_gc_auto) a minor one. A full GC sweeps
    # at once: swept lazily, the sweep would run inside the next requests.
    def collect
      full = @oob_gc.positive? || (@oob_major_gc && major_needed?)
      @gc.start(full_mark: full, immediate_sweep: full)
    end

    # With max_memory_per_child, the exit line says how far RSS went: " (peak RSS N KiB)" (the kernel
    # keeps the peak of RSS, VmHWM; there is no such peak of USS).
    def peak
      return "" if @limit_kib.zero?

      " (peak RSS #{File.read("#{@proc}/status")[/^VmHWM:\s*(\d+)/, 1]} KiB)"
    rescue SystemCallError
      ""
    end

    private

    # RSS over the limit: is USS worth reading again? Yes the first time; then when RSS has grown
    # past the last USS's headroom (new pages may all be private: a leak is seen as soon as by RSS),
    # or when USS_COST_SHARE of the time since the last read has paid for one more (pages shared
    # with the master turn private without RSS moving, as the worker writes to them: copy on
    # write). A worker that only shares pages is so read a few times a second at most.
    def uss_due?(now, rss)
      @uss.nil? || @uss + (rss - @uss_rss) > @limit_kib || now >= @uss_at
    end

    def read_uss(now, rss)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @uss = read_kib("smaps_rollup") { |s| s[/^Private_Clean:\s*(\d+)/, 1].to_i + s[/^Private_Dirty:\s*(\d+)/, 1].to_i }
      @uss_rss = rss
      @uss_at = now + ((Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) / USS_COST_SHARE)
      @uss
    rescue SystemCallError # readable at start, not now: RSS still is (the stop line will say RSS)
      @measure = :rss
      rss
    end

    def read_kib(name) = yield(File.read("#{@proc}/#{name}"))

    # oob_major_gc, after each request: has Ruby flagged a major GC (need_major_by)? One flagged and
    # not run within OOB_MAJOR_GC_WAIT_REQUESTS requests or OOB_MAJOR_GC_WAIT_SECONDS (the worker found
    # no idle moment) gets Ruby's own major GCs allowed again: its next GC is then that major, inside
    # a request, as without the setting. Once a major has run (Ruby's, or #collect's) they are off again.
    def major_due?(served)
      if @full_marks_back && @gc.stat(:major_gc_count) != @full_marks_back
        @gc.config(rgengc_allow_full_mark: false)
        @full_marks_back = nil
      end
      unless major_needed?
        @major_wanted = nil
        return false
      end
      @major_wanted ||= [served, @clock.call]
      allow_full_marks if @full_marks_back.nil? && major_overdue?(served)
      true
    end

    # (GC.latest_gc_info(key) allocates nothing.)
    def major_needed? = !@gc.latest_gc_info(:need_major_by).nil?

    def major_overdue?(served)
      since, at = @major_wanted
      served - since >= OOB_MAJOR_GC_WAIT_REQUESTS || @clock.call - at >= OOB_MAJOR_GC_WAIT_SECONDS
    end

    def allow_full_marks
      @full_marks_back = @gc.stat(:major_gc_count)
      @gc.config(rgengc_allow_full_mark: true)
    end

    # Would the next request's allocations trigger a GC anyway? Yes when a heap has fewer free
    # slots than the last request allocated in it (or than OOB_GC_FREE_SLOTS of its live ones), or
    # malloc is near its limit. Ruby >= 3.2 collects when any one size pool runs out, while the
    # others may have room: the heap's total free slots said "far" on 3.4 while the 40-byte pool ran
    # out in every request. (GC.stat(key) and GC.stat_heap(i, key) allocate nothing; objects not yet
    # swept count as live, so this errs towards a GC between requests.)
    def gc_near?
      return true if @gc.stat(:malloc_increase_bytes) > @gc.stat(:malloc_increase_bytes_limit) * OOB_GC_MALLOC

      spare = @pools.zero? ? 0 : @gc.stat(:heap_allocatable_slots) # pages a pool may still add without a GC
      near = false
      @allocated.each_index do |i|
        allocated, live, free = pool_slots(i)
        last = @allocated[i]
        @allocated[i] = allocated
        next if live < OOB_GC_MIN_SLOTS

        need = [last ? allocated - last : 0, (live * OOB_GC_FREE_SLOTS).to_i].max
        near ||= free + spare < need
      end
      near
    end

    # [objects ever allocated, live slots, free slots] of size pool i (3.1: of the heap).
    def pool_slots(i)
      return [@gc.stat(:total_allocated_objects), @gc.stat(:heap_live_slots), @gc.stat(:heap_free_slots)] if @pools.zero?

      allocated = @gc.stat_heap(i, :total_allocated_objects)
      live = allocated - @gc.stat_heap(i, :total_freed_objects)
      [allocated, live, @gc.stat_heap(i, :heap_eden_slots) - live]
    end
  end
end
