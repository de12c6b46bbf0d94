# frozen_string_literal: true

require_relative "request_counts"

module Blackbuck
  # GET /metrics: a status snapshot (StatusSnapshot#take) and the whole run's histograms
  # (StatusSnapshot#histograms) as Prometheus text exposition format (version 0.0.4). Only
  # rendering: every number comes from its arguments.
  module StatusMetrics
    QUANTILE_LABELS = { "p50" => "0.5", "p99" => "0.99" }.freeze
    ROLES = %w[master mold worker].freeze # the roles of StatusSnapshot's "processes"
    KIB = 1024 # bytes
    MEMORY_HELP = {
      "uss" => "Private memory (USS) of the server's processes, summed per role.",
      "pss" => "Proportional set size (private memory plus a share of what is shared) of the server's " \
               "processes, summed per role."
    }.freeze

    module_function

    # snap: the snapshot Hash; totals: RequestCounts::Totals of the whole run.
    def text(snap, totals)
      out = +""
      family = lambda do |name, type, help, samples|
        out << "# HELP #{name} #{help}\n# TYPE #{name} #{type}\n"
        samples.each { |labels, value| out << "#{name}#{labels_text(labels)} #{value}\n" }
      end
      t = snap["totals"]
      family.call("blackbuck_build_info", "gauge", "The Blackbuck and Ruby versions of the master (always 1).",
                  [[{ "version" => snap["version"], "ruby" => snap["ruby"] }, 1]])
      family.call("blackbuck_workers", "gauge", "Worker processes.", [[{}, t["workers"]]])
      family.call("blackbuck_workers_busy", "gauge", "Workers running a request in the app.", [[{}, t["busy"]]])
      # A counter never decreases: per worker slot, what its exited workers served plus its live one.
      family.call("blackbuck_requests_total", "counter",
                  "Requests served since the master started, per worker slot (replaced workers included).",
                  snap["slots"].map { |s| [{ "worker" => s["index"] }, s["requests"]] })
      family.call("blackbuck_connections", "gauge", "Open client connections.", [[{}, t["connections"]]])
      family.call("blackbuck_streams", "gauge", "Open streams: responses whose body waits on a fiber, per worker.",
                  snap["workers"].map { |w| [{ "worker" => w["index"] }, w["streams"]] })
      family.call("blackbuck_spill_bytes", "gauge", "Bytes of responses clients have not taken, queued in spill files.",
                  snap["workers"].map { |w| [{ "worker" => w["index"] }, w["spill_bytes"]] })
      known = snap["listeners"].reject { |l| l["queued"].nil? }
      family.call("blackbuck_listen_queue", "gauge", "Connections waiting in a listener's accept queue.",
                  known.map { |l| [{ "listener" => l["name"] }, l["queued"]] })
      family.call("blackbuck_listen_backlog", "gauge", "Accept-queue limit of a listener.",
                  known.map { |l| [{ "listener" => l["name"] }, l["backlog"]] })
      histogram(out, "blackbuck_request_queue_seconds",
                "Seconds from a request's arrival (or its X-Request-Start) to the app's start.", totals.queue)
      histogram(out, "blackbuck_request_duration_seconds", "Seconds a request spent in the app and writing its answer.",
                totals.duration)
      family.call("blackbuck_requests_shed_total", "counter",
                  "Requests answered 503 because they had waited longer than max_queue_time.", [[{}, totals.shed]])
      family.call("blackbuck_connections_moved_total", "counter",
                  "Connections whose waiting request moved to a free worker while their own ran the app long.",
                  [[{}, totals.moved_out]])
      family.call("blackbuck_handoff_failures_total", "counter",
                  "Moves of a connection between workers that did not happen: refused (the receiving worker had " \
                  "too few descriptors free; it stayed queued for another), send (the sender kept it), lost " \
                  "(the kernel dropped its descriptor at the receiver; the client was reset).",
                  totals.handoff_failures_by_reason.map { |why, n| [{ "reason" => why }, n] })
      memory(family, snap["processes"])
      family.call("blackbuck_refork_generation", "gauge",
                  "Generation the workers are forked in (refork_after: 0 from the master, +1 per mold).",
                  [[{}, snap.dig("refork", "generation") || 0]])
      if snap["worker_exits"]
        family.call("blackbuck_worker_exits_total", "counter",
                    "Workers that exited while the master served, by why: crash, timeout, recycle " \
                    "(max_requests_per_child), memory (max_memory_per_child), ttou (retired, not replaced), " \
                    "refork (retired for the next generation), other. All but ttou were replaced.",
                    snap["worker_exits"].map { |why, n| [{ "reason" => why }, n] })
      end
      started = snap["workers"].reject { |w| w["state"] == "starting" }
      family.call("blackbuck_worker_queue_seconds", "summary",
                  "Seconds a worker's requests waited for its app (arrival to app start), over its life.",
                  started.flat_map do |w|
                    w["queue_time"].filter_map do |q, v|
                      [{ "worker" => w["index"], "quantile" => QUANTILE_LABELS.fetch(q) }, v] if v
                    end
                  end)
      out
    end

    # USS and PSS summed per role (StatusSnapshot's "processes": what /proc says of each), in bytes; a
    # role without a process (no mold) has no sample.
    def memory(family, processes)
      return unless processes

      by_role = processes.group_by { |p| p["role"] }
      MEMORY_HELP.each do |kind, help|
        samples = ROLES.filter_map do |role|
          known = (by_role[role] || []).filter_map { |p| p["#{kind}_kib"] }
          [{ "role" => role }, known.sum * KIB] unless known.empty?
        end
        family.call("blackbuck_memory_#{kind}_bytes", "gauge", help, samples)
      end
    end

    # A Prometheus histogram: cumulative buckets, +Inf, sum and count.
    def histogram(out, name, help, hist)
      out << "# HELP #{name} #{help}\n# TYPE #{name} histogram\n"
      cumulative = 0
      hist.counts.each_with_index do |n, i|
        cumulative += n
        le = i < RequestCounts::BOUNDS.size ? RequestCounts::BOUNDS[i].to_s : "+Inf"
        out << %(#{name}_bucket{le="#{le}"} #{cumulative}\n)
      end
      out << "#{name}_sum #{hist.sum.round(6)}\n#{name}_count #{cumulative}\n"
    end

    # {"worker" => 0} -> {worker="0"}: label values escaped as the format asks (\\, \", \n).
    def labels_text(labels)
      return "" if labels.empty?

      "{#{labels.map { |k, v| %(#{k}="#{v.to_s.gsub(/[\\"\n]/, '\\' => '\\\\', '"' => '\\"', "\n" => '\\n')}") }.join(',')}}"
    end
  end
end
