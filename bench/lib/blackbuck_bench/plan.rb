# frozen_string_literal: true

require_relative "options"

module BlackbuckBench
  # Which servers measure which workload in which cells, with what load, and how long the whole
  # run will take. Printed at the start of every run; bench/test checks the full run's estimate
  # against FULL_RUN_BUDGET_S.
  module Plan
    FULL_RUN_BUDGET_S = 45 * 60
    MEASURE_OVERHEAD_S = 0.7  # tool start and exit, /proc reads, Stats::SETTLE_S
    BOOT_S = 2.5              # one server's boot, probe and stop, on 2 busy cores (Rails: more)
    RAILS_BOOT_S = 4.0
    CROSSCHECK_RUNS = 8       # 4 runs (main, other, main, other) x 2 transports

    Step = Struct.new(:workload, :servers, :cells, :workers, :connections, :duration, keyword_init: true)

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
      Step.new(workload: w, servers: servers_for(w, opts), cells: cells, workers: w.workers || opts[:workers],
               connections: w.connections || opts[:connections], duration: duration)
    end

    # nginx `return 200` only where it serves the same bytes (the ceiling); the +yjit twins only
    # on the workloads where the app's Ruby code is more than a sleep, unless named in --servers.
    def servers_for(w, opts)
      opts[:servers].select do |name|
        r = Servers.fetch(name)
        next w.ceiling && !w.front if !r.ruby?
        next true if opts[:servers_given] || !r.yjit?

        opts[:quick] ? w.quick_yjit : w.yjit
      end
    end

    # => { cells:, measurements:, boots:, seconds: }; absent servers (present: false) cost nothing
    def estimate(steps, opts, present: ->(name) { Servers.fetch(name).absent_reason.nil? })
      n = steps.to_h { |s| [s, s.servers.count(&present)] }
      cells = steps.sum { |s| n[s] * s.cells.size }
      measuring = steps.sum { |s| n[s] * s.cells.size * opts[:repeat] * (s.duration + MEASURE_OVERHEAD_S) }
      boots = steps.sum { |s| n[s] }
      booting = steps.sum { |s| n[s] * ((s.workload.rack2 ? RAILS_BOOT_S : BOOT_S) + opts[:warmup]) }
      cross = opts[:crosscheck] ? CROSSCHECK_RUNS * (opts[:duration] + MEASURE_OVERHEAD_S) : 0
      { cells: cells, measurements: cells * opts[:repeat], boots: boots, seconds: (measuring + booting + cross).round }
    end

    def describe(steps, opts)
      e = estimate(steps, opts)
      lines = steps.map do |s|
        "  #{s.workload.name}: #{s.servers.size} servers x #{s.cells.map { |c| c.join('/') }.join(', ')}, " \
          "#{s.workers} workers, #{s.connections} connections, #{s.duration} s"
      end
      "plan: #{e[:cells]} cells x #{opts[:repeat]} runs = #{e[:measurements]} measurements, #{e[:boots]} boots; " \
        "estimate #{(e[:seconds] / 60.0).round(1)} min\n#{lines.join("\n")}"
    end
  end
end
