# frozen_string_literal: true

require_relative "options"
require_relative "server_ruby"

module BlackbuckBench
  # Which servers measure which workload in which cells, with what load, and how long the whole
  # run will take. Printed at the start of every run; bench/test checks the full run's estimate
  # against FULL_RUN_BUDGET_S.
  module Plan
    # The throughput rows' share of a full run: 45 min on 3.1; on 3.4 and 4.0 (the twins where the
    # rows without YJIT ran, M:N and Falcon rows) about 50 min
    FULL_RUN_BUDGET_S = 60 * 60
    # Calibrated on the shared 2-core machine with a load average of 4 (bench:quick: 1.3 s per
    # 1 s measurement; 20 servers booted four at a time in 27 s, ten Rails servers in 22 s).
    MEASURE_OVERHEAD_S = 0.5  # tool start and exit, /proc reads, Stats::SETTLE_S
    BOOT_S = 1.5              # one server's boot and probe, four at a time, and its stop
    RAILS_BOOT_S = 3.0
    CROSSCHECK_RUNS = 8       # 4 runs (main, other, main, other) x 2 transports
    # h2load runs a request count sized from the blackbuck-load warm-up's rate; where h2load
    # gets less (io-wait, Blackbuck: half), a measurement lasts up to twice --duration
    DRIVER_SLACK = { "h2load" => 1.5 }.freeze
    MIN_RATE_WARMUP_S = 0.5 # warm-up that measures a rate for h2load's request count (even in quick)
    # One memory row: Rails boot with 4 workers, the 6,000-request warm-up, the req/s load, the
    # stop, most of it the warm-up (measured: 21 rows in 503 s, bench/results/memory.md; a
    # margin for rows whose refork takes top-ups)
    MEMORY_ROW_S = 30
    # the memory workload's share of a full run, on top of FULL_RUN_BUDGET_S: 51 rows (17 configurations,
    # each with and without jemalloc and YJIT, and three with YJIT's 64 MiB code region), ~26 min
    MEMORY_BUDGET_S = 30 * 60
    # One streams row (StreamsStep), at most: a boot alone (~3 s), warm-up and the fast load alone
    # (--warmup + 2 s), the client's start, its bound (StreamShape#bound_s, 19 s: a server that does
    # not hold 1,000 streams reaches it) and a stop that may wait for busy workers (up to
    # ServerProcess::STOP_GRACE_S, 10 s). A server that holds every stream leaves after ~5 s of
    # streams: the estimate is an upper bound.
    STREAMS_ROW_EXTRA_S = 3 + 10
    # the streams workload's share of a full run, on top of the others: 8 rows, at most ~5 min
    STREAMS_BUDGET_S = 6 * 60

    # cells_for: the cells a server runs: all of them, but in --quick only the first for the rows
    # that are the comparison (the +yjit twins; on a Ruby with YJIT by default, the rows without it)
    # shape: the streams workload's StreamShape, with --streams / --stream-events applied
    Step = Struct.new(:workload, :servers, :cells, :workers, :connections, :duration, :shape, keyword_init: true) do
      def cells_for(server) = quick && comparison?(server) ? cells.first(1) : cells

      def comparison?(server)
        yjit = server.end_with?("+yjit")
        yjit_default ? !yjit && Servers.fetch(server).ruby? : yjit
      end

      attr_accessor :quick, :yjit_default
    end

    module_function

    def build(opts)
      opts[:workloads].map { |name| step(BlackbuckBench.workload(name), opts) }
                      .reject { |s| s.cells.empty? || s.servers.empty? }
    end

    def step(w, opts)
      cells = (opts[:quick] ? w.quick_cells : w.cells).select do |t, m|
        opts[:transports].include?(t) && opts[:modes].include?(m)
      end
      duration = w.duration || opts[:duration]
      duration = [duration, opts[:duration]].min if opts[:quick]
      step = Step.new(workload: w, servers: servers_for(w, opts), cells: cells, workers: w.workers || opts[:workers],
                      connections: w.connections || opts[:connections], duration: duration)
      step.shape = stream_shape(w, opts) if w.streams?
      step.quick = opts[:quick] && !opts[:servers_given]
      step.yjit_default = server_ruby(opts).yjit_by_default?
      step
    end

    def stream_shape(w, opts)
      shape = w.streams.dup
      shape.streams = opts[:streams] if opts[:streams]
      shape.events = opts[:stream_events] if opts[:stream_events]
      shape.freeze
    end

    # The run's Ruby (ServerRuby.current, set by run.rb; opts[:server_ruby] in the tests).
    def server_ruby(opts) = opts[:server_ruby] || ServerRuby.current

    # nginx `return 200` only where it serves the same bytes (the ceiling). YJIT: on a Ruby where
    # it is not on by default (3.1), the +yjit twins only on the workloads where the app's Ruby
    # code is more than a sleep (Workload#yjit); on one where it is (3.4, 4.0), the twins
    # everywhere and the rows without YJIT on those workloads only. A recipe that cannot run on the
    # run's Ruby (Debian's packages elsewhere than on 3.1, M:N threads before 3.3) is left out.
    # --servers runs what it names, as named.
    def servers_for(w, opts)
      ruby = server_ruby(opts)
      opts[:servers].select do |name|
        r = Servers.fetch(name)
        base = name.delete_suffix("+yjit") # quick_servers and threaded name the rows, not their twins
        # the memory workload runs its own rows (on its Rails app), and they run nowhere else; a
        # row of another workload (blackbuck-streams) runs there only, by the rules below
        next r.only == w.name if w.memory?
        next false if r.only && r.only != w.name
        next true if opts[:servers_given] && (r.ruby? || (w.ceiling && !w.front))
        next false if w.rows && !w.rows.include?(base)
        next false if r.unfit_for(ruby)
        next false if opts[:quick] && w.quick_servers && !w.quick_servers.include?(base)
        if r.threaded?
          next false unless w.threaded&.include?(base)
          next false if opts[:quick] && !w.quick_servers&.include?(base)
        end
        next w.ceiling && !w.front if !r.ruby?

        yjit_rows = opts[:quick] ? w.quick_yjit : w.yjit
        if ruby.yjit_by_default?
          r.yjit? || (yjit_rows && w.without_yjit)
        else
          !r.yjit? || (yjit_rows && !r.threaded?)
        end
      end
    end

    # => { cells:, measurements:, boots:, seconds: }; absent servers (present: false) cost nothing
    # The memory workload's rows are measured once each (no --repeat: see MemoryStep).
    # The streams workload's rows likewise (StreamsStep), streams_seconds apart too.
    def estimate(steps, opts, present: ->(name) { Servers.fetch(name).absent_reason(server_ruby(opts)).nil? })
      memory, steps = steps.partition { |s| s.workload.memory? }
      streams, steps = steps.partition { |s| s.workload.streams? }
      rows = memory.sum { |s| s.servers.count(&present) }
      stream_rows = streams.sum { |s| s.servers.count(&present) }
      stream_seconds = streams.sum { |s| s.servers.count(&present) * streams_row_s(s, opts) }.round
      e = estimate_throughput(steps, opts, present)
      { cells: e[:cells] + rows + stream_rows, measurements: e[:measurements] + rows + stream_rows,
        boots: e[:boots] + rows + stream_rows, seconds: e[:seconds] + rows * MEMORY_ROW_S + stream_seconds,
        memory_seconds: rows * MEMORY_ROW_S, streams_seconds: stream_seconds }
    end

    def streams_row_s(step, opts)
      STREAMS_ROW_EXTRA_S + opts[:warmup] + step.duration + MEASURE_OVERHEAD_S + step.shape.bound_s
    end

    def estimate_throughput(steps, opts, present)
      n = steps.to_h { |s| [s, s.servers.count(&present)] }
      cells_of = ->(s) { s.servers.select(&present).sum { |name| s.cells_for(name).size } }
      cells = steps.sum(&cells_of)
      measuring = steps.sum do |s|
        cells_of.call(s) * opts[:repeat] * (s.duration * DRIVER_SLACK.fetch(s.workload.driver, 1) + MEASURE_OVERHEAD_S)
      end
      boots = steps.sum { |s| n[s] }
      booting = steps.sum do |s|
        warmup = s.workload.driver ? [opts[:warmup], MIN_RATE_WARMUP_S].max : opts[:warmup]
        n[s] * ((s.workload.rails ? RAILS_BOOT_S : BOOT_S) + warmup)
      end
      # the cross-check runs in a throughput workload's step (not BENCH_ONLY=memory or streams)
      cross = opts[:crosscheck] && steps.any? ? CROSSCHECK_RUNS * (opts[:duration] + MEASURE_OVERHEAD_S) : 0
      { cells: cells, measurements: cells * opts[:repeat], boots: boots, seconds: (measuring + booting + cross).round }
    end

    def describe(steps, opts)
      e = estimate(steps, opts)
      lines = steps.map do |s|
        next "  #{s.workload.name}: #{s.servers.size} servers one at a time, measured once (~#{MEMORY_ROW_S} s each), #{s.workers} workers" if s.workload.memory?

        if s.workload.streams?
          sh = s.shape
          next "  #{s.workload.name}: #{s.servers.size} servers one at a time, measured once (at most ~#{streams_row_s(s, opts).round} s each), " \
               "#{s.workers} workers, #{sh.streams} streams x #{sh.events} events / #{sh.interval_ms} ms (ramp #{sh.ramp_s} s, " \
               "bound #{sh.bound_s} s) + #{s.connections} fast connections, #{s.duration} s with and without streams"
        end

        "  #{s.workload.name}: #{s.servers.size} servers x #{s.cells.map { |c| c.join('/') }.join(', ')}, " \
          "#{s.workers} workers, #{s.connections} connections, #{s.duration} s"
      end
      "plan: servers on #{server_ruby(opts).description} (YJIT #{server_ruby(opts).yjit_by_default? ? 'on by default: the +yjit rows, the others only where YJIT is compared' : 'in the +yjit rows only'})\n" \
        "plan: #{e[:cells]} cells x #{opts[:repeat]} runs = #{e[:measurements]} measurements, #{e[:boots]} boots; " \
        "estimate #{(e[:seconds] / 60.0).round(1)} min\n#{lines.join("\n")}"
    end
  end
end
