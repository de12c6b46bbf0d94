# frozen_string_literal: true

require "json"

module BlackbuckBench
  # Reads what bench/apps/lib/bench_stats.rb writes: one BENCH_STATS_DIR/PID.json per worker
  # process that served a request ({"pid", "requests", "ruby", "yjit", "rack", "server"}).
  module Stats
    # Longer than BenchStats::FLUSH_INTERVAL_S (0.05 s): after a measurement (longer than its
    # IDLE_INTERVAL_S, so its thread is back at the short interval) every worker's
    # thread has written its final count by then.
    SETTLE_S = 0.2

    module_function

    # { pid => the file's fields }
    def read(dir)
      return {} unless dir && Dir.exist?(dir)

      Dir.glob(File.join(dir, "*.json")).each_with_object({}) do |path, out|
        j = JSON.parse(File.read(path))
        out[j["pid"]] = j
      rescue JSON::ParserError, Errno::ENOENT
        next
      end
    end

    # Requests each worker served between two reads, and the balance: the busiest worker's share
    # of all of them (100 / workers % is perfect balance; 100 % means one worker did everything).
    # workers: how many the server was started with, so a worker that served nothing (and so
    # never wrote a file) still counts as idle.
    def balance(before, after, workers)
      counts = after.filter_map do |pid, j|
        n = j["requests"].to_i - before.dig(pid, "requests").to_i
        n if n.positive?
      end.sort.reverse
      total = counts.sum
      return nil if total.zero?

      { "per_worker" => counts, "counted" => total, "workers_serving" => counts.size, "workers" => workers,
        "busiest_share_pct" => (counts.first * 100.0 / total).round(1) }
    end

    # What the workers report about themselves (the same for every worker of a server).
    def facts(dir)
      read(dir).values.map { |j| j.slice("ruby", "yjit", "rack", "server") }.uniq
    end
  end
end
