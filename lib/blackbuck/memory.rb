# frozen_string_literal: true

require "etc"

module Blackbuck
  # A worker's memory between requests: max_memory_per_child (its RSS, read after requests and on
  # ticks) and out-of-band GC (oob_gc, oob_gc_auto: a collection between requests rather than
  # inside one). The worker asks; it decides when to stop and when the loop is idle enough to GC.
  class Memory
    PAGE_KIB = Etc.sysconf(Etc::SC_PAGESIZE) / 1024
    CHECK_SECONDS = 0.01      # RSS is read at most this often while requests are served
    OOB_GC_FREE_SLOTS = 0.1   # fraction of live slots: fewer free slots than this and a GC is near
    OOB_GC_MALLOC = 0.9       # fraction of the malloc limit that counts as near

    attr_reader :limit_kib # max_memory_per_child, KiB (0: none)

    def initialize(config)
      @oob_gc = config[:oob_gc]
      @oob_gc_auto = config[:oob_gc_auto]
      @limit_kib = config[:max_memory_per_child]
      @check_at = 0.0 # when RSS is read next after a request (#check_due?)
    end

    # Whether a request served has anything to do here at all.
    def per_request? = @oob_gc.positive? || @oob_gc_auto || @limit_kib.positive?

    # After the served-th request: is a GC due between requests (every oob_gc requests, or with
    # oob_gc_auto when the next allocations would trigger one anyway)?
    def gc_due?(served)
      (@oob_gc.positive? && (served % @oob_gc).zero?) || (@oob_gc_auto && gc_near?)
    end

    # After a request at `now`: is RSS to be read (CHECK_SECONDS apart at most)?
    def check_due?(now) = @limit_kib.positive? && now >= @check_at

    # RSS in KiB when it is over max_memory_per_child, else nil. Read at `now`.
    def over_limit(now)
      return if @limit_kib.zero?

      @check_at = now + CHECK_SECONDS
      rss = File.read("/proc/self/statm").split[1].to_i * PAGE_KIB
      rss if rss > @limit_kib
    rescue SystemCallError
      @limit_kib = 0 # no /proc here: nothing to check
      nil
    end

    # Between requests, and only when no client is waiting: every oob_gc requests a full GC, with
    # oob_gc_auto a minor one.
    def collect
      full = @oob_gc.positive?
      GC.start(full_mark: full, immediate_sweep: full)
    end

    # With max_memory_per_child, the exit line says how far RSS went: " (peak RSS N KiB)".
    def peak
      return "" if @limit_kib.zero?

      " (peak RSS #{File.read('/proc/self/status')[/^VmHWM:\s*(\d+)/, 1]} KiB)"
    rescue SystemCallError
      ""
    end

    private

    # Would the next allocations trigger a GC anyway? (GC.stat(key) allocates nothing.)
    def gc_near?
      GC.stat(:heap_free_slots) < GC.stat(:heap_live_slots) * OOB_GC_FREE_SLOTS ||
        GC.stat(:malloc_increase_bytes) > GC.stat(:malloc_increase_bytes_limit) * OOB_GC_MALLOC
    end
  end
end
