# frozen_string_literal: true

module Blackbuck
  # Requests served through each scoreboard slot since this master started, with their queue-time
  # and duration histograms and the requests max_queue_time shed. A worker's own numbers live in
  # its slot and start again at 0 when a new worker takes the slot, so the master adds each
  # worker's final numbers here when it reaps it. Supervisor#reap does that before spawn_missing
  # forks the slot's next worker (which resets the slot), and the shared memory outlives the
  # worker, so a worker killed by SIGKILL still counts every request it finished. Per slot, exited
  # + live never decreases while the master lives: Prometheus counters and histograms.
  class RequestCounts
    BOUNDS = Native::Scoreboard::BUCKET_BOUNDS_US.map { |us| us / 1e6 }.freeze # seconds; then +Inf
    # Why a move between workers did not happen: the receiver had too few descriptors free and left it
    # queued for another (refused), the send failed and the sender kept it (send), the kernel dropped
    # its descriptor at the receiver and the client was reset (lost).
    HANDOFF_FAILURES = Native::Scoreboard::HANDOFF_FAILURES
    WINDOW = 60      # seconds the "recent" percentiles of /status cover
    SAMPLE_EVERY = 5 # seconds between the snapshots the window is measured against

    # One histogram: counts per bucket (BOUNDS, then +Inf; not cumulative), the sum in seconds and
    # the largest sample in seconds. A difference (#-, the "recent" window) keeps the larger side's
    # max: the largest sample since the start, an upper bound of the window's own.
    Hist = Struct.new(:counts, :sum, :max) do
      def self.empty = new(Array.new(BOUNDS.size + 1, 0), 0.0, 0.0)
      def self.from_slot((counts, sum_us, max_us)) = new(counts, sum_us / 1e6, max_us / 1e6)

      def +(other) = Hist.new(counts.zip(other.counts).map(&:sum), sum + other.sum, [max, other.max].max)
      def -(other) = Hist.new(counts.zip(other.counts).map { |a, b| a - b }, sum - other.sum, max)
      def count = counts.sum

      # The q-quantile (0 < q < 1), interpolated within its bucket as Prometheus' histogram_quantile
      # does, but never above the largest sample (one 5 s request in the 5-10 s bucket read as a p99 of
      # 9.95 s); in the +Inf bucket, the largest sample. nil without samples.
      def quantile(q)
        total = count
        return nil if total.zero?

        rank = q * total
        seen = 0
        counts.each_with_index do |n, i|
          if seen + n >= rank && n.positive?
            return max if i == BOUNDS.size

            lower = i.zero? ? 0.0 : BOUNDS[i - 1]
            return [lower + ((BOUNDS[i] - lower) * (rank - seen) / n), max].min
          end
          seen += n
        end
        max
      end
    end

    # Everything of one or more slots: the two histograms, sheds, connections moved out and in, and
    # moves that did not happen (counts in the order of HANDOFF_FAILURES).
    Totals = Struct.new(:queue, :duration, :shed, :moved_out, :moved_in, :handoff_failures) do
      def self.empty = new(Hist.empty, Hist.empty, 0, 0, 0, Array.new(HANDOFF_FAILURES.size, 0))

      def +(other)
        Totals.new(queue + other.queue, duration + other.duration, shed + other.shed, moved_out + other.moved_out,
                   moved_in + other.moved_in, handoff_failures.zip(other.handoff_failures).map(&:sum))
      end

      def -(other)
        Totals.new(queue - other.queue, duration - other.duration, shed - other.shed, moved_out - other.moved_out,
                   moved_in - other.moved_in, handoff_failures.zip(other.handoff_failures).map { |a, b| a - b })
      end

      # {"refused" => n, "send" => n, "lost" => n}
      def handoff_failures_by_reason = HANDOFF_FAILURES.zip(handoff_failures).to_h { |why, n| [why.to_s, n] }
    end

    def initialize(scoreboard)
      @scoreboard = scoreboard
      @exited = Hash.new(0) # slot index => requests served by the slot's workers that have exited
      @exited_totals = Totals.empty
      @samples = [] # [[monotonic time, Totals]], oldest first, spanning WINDOW
    end

    # Master: the worker `pid` of slot `index` has been reaped; its slot still holds its numbers.
    def worker_exited(index, pid)
      slot = @scoreboard.read(index)
      # A worker that died before taking its slot left its predecessor's numbers there, added already.
      return unless slot.pid == pid

      @exited[index] += slot.requests
      @exited_totals += slot_totals(index)
    end

    # live: {slot index => requests of the slot's current worker}. Every slot that has served or
    # has a worker, in index order: {index => requests since the master started}.
    def per_slot(live)
      (@exited.keys | live.keys).sort.to_h { |i| [i, @exited[i] + live.fetch(i, 0)] }
    end

    # Histograms and sheds of every worker this master ran; live: the indexes of started workers.
    def totals(live) = live.sum(@exited_totals) { |i| slot_totals(i) }

    # Master loop: keeps a snapshot every SAMPLE_EVERY seconds for #recent.
    def sample(live, now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
      return if @samples.any? && now - @samples.last[0] < SAMPLE_EVERY

      @samples << [now, totals(live)]
      @samples.shift while @samples.size > 1 && now - @samples[1][0] >= WINDOW
    end

    # What happened over about the last WINDOW seconds: Totals (the difference from the oldest
    # snapshot; everything since the start while the master is younger than the window) and the
    # seconds covered.
    def recent(live, now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
      current = totals(live)
      return [current, nil] if @samples.empty?

      at, base = @samples.first
      [current - base, now - at]
    end

    # One slot's numbers (its current worker's, or its last one's).
    def slot_totals(index)
      queue, duration, shed, moved_out, moved_in, handoff_failures = @scoreboard.histograms(index)
      Totals.new(Hist.from_slot(queue), Hist.from_slot(duration), shed, moved_out, moved_in, handoff_failures)
    end
  end
end
