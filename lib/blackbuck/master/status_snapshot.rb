# frozen_string_literal: true

require_relative "../version"
require_relative "request_counts"
require_relative "../memory"

module Blackbuck
  # The numbers the status listener answers with, read when asked: every worker's scoreboard slot,
  # the listen queues, the requests served per slot and in total (RequestCounts), as one Hash (the
  # JSON body of GET /status; StatusMetrics renders the same Hash for GET /metrics). It reads and
  # never changes anything: a status client cannot disturb the master.
  class StatusSnapshot
    STATE_NAMES = Native::Scoreboard::NAMES

    # children: the master's Children; listeners: its Listeners (their accept queues); exits: its
    # WorkerExits (why workers exited).
    def initialize(children:, request_counts:, scoreboard:, listeners:, refork: nil, exits: nil)
      @children = children
      @refork = refork
      @exits = exits
      @request_counts = request_counts
      @scoreboard = scoreboard
      @listeners = listeners
    end

    # The whole status as one Hash. A worker's "requests" are its own (0 again when it is
    # replaced); "slots" and totals.requests count every request the master's workers served,
    # those that have exited included (RequestCounts).
    def take
      workers = @children.sort_by(&:index).map { |c| worker_entry(c) }
      slots = @request_counts.per_slot(workers.to_h { |w| [w["index"], w["requests"]] })
      live = started(workers)
      recent, seconds = @request_counts.recent(live)
      totals = @request_counts.totals(live)
      listeners = @listeners.map do |l|
        queued, backlog = (l.io.closed? ? nil : Native.listen_queue(l.fd))
        { "name" => l.name, "queued" => queued, "backlog" => backlog }
      end
      {
        "pid" => Process.pid,
        "version" => VERSION,
        "ruby" => RUBY_VERSION,
        # Every process of the server with its role and what it costs (Memory.usage): the master, the
        # mold (refork_after) and the workers (their USS is also in "workers").
        "processes" => processes(workers),
        "refork" => @refork&.status,
        # Workers that exited while the master served, by why (WorkerExits::REASONS).
        "worker_exits" => @exits&.counts,
        "workers" => workers,
        "listeners" => listeners,
        "slots" => slots.map { |index, requests| { "index" => index, "requests" => requests } },
        "totals" => {
          "workers" => workers.size,
          "busy" => workers.count { |w| w["state"] == "busy" },
          "idle" => workers.count { |w| w["state"] == "idle" },
          "requests" => slots.values.sum,
          "connections" => workers.sum { |w| w["connections"] },
          "streams" => workers.sum { |w| w["streams"] },
          "spill_bytes" => workers.sum { |w| w["spill_bytes"] },
          "queued" => listeners.sum { |l| l["queued"] || 0 },
          "shed" => totals.shed,
          "moved" => totals.moved_out,
          "handoff_failures" => totals.handoff_failures_by_reason # RequestCounts::HANDOFF_FAILURES
        },
        # The last RequestCounts::WINDOW seconds (less while the master is younger): seconds from a
        # request's arrival (or its X-Request-Start) to the app's start, and seconds in the app.
        "recent" => {
          "seconds" => seconds&.round(1),
          "requests" => recent.duration.count,
          "queue_time" => percentiles(recent.queue),
          "duration" => percentiles(recent.duration),
          "shed" => recent.shed,
          "moved" => recent.moved_out
        }
      }
    end

    # The whole-run histograms (every worker this master ran) of the workers in snap, for /metrics.
    def histograms(snap) = @request_counts.totals(started(snap["workers"]))

    private

    # The slots of the workers in the snapshot that have started (their numbers are live).
    def started(workers) = workers.reject { |w| w["state"] == "starting" }.map { |w| w["index"] }

    def percentiles(hist)
      { "p50" => hist.quantile(0.5)&.round(6), "p99" => hist.quantile(0.99)&.round(6) }
    end

    def worker_entry(child)
      slot = @scoreboard.read(child.index)
      started = slot.pid == child.pid # the slot is the fork's until the worker resets it
      running = started && slot.running_ms.positive?
      own = started ? @request_counts.slot_totals(child.index) : RequestCounts::Totals.empty
      {
        "index" => child.index,
        "pid" => child.pid,
        "generation" => child.generation || 0,
        "forked_by" => (child.origin || :master).to_s,
        "state" => started ? state_name(slot.state, slot.running_ms) : "starting",
        "requests" => started ? slot.requests : 0,
        "connections" => started ? slot.connections : 0,
        # of them, responses whose stream body waits on a fiber (the worker is free meanwhile)
        "streams" => started ? slot.streams : 0,
        "spill_bytes" => started ? slot.spill_bytes : 0,
        "running_ms" => started ? slot.running_ms : 0,
        "method" => running ? slot.request_method : nil,
        "path" => running ? slot.path : nil,
        "heartbeat_age_ms" => started ? slot.heartbeat_age_ms : nil,
        # Since the worker started: its requests' wait from arrival to the app's start, and the
        # connections it moved to other workers (Native::Handoff) or took from them.
        "queue_time" => percentiles(own.queue),
        "moved_out" => own.moved_out,
        "moved_in" => own.moved_in
      }
    end

    def processes(workers)
      list = [{ "role" => "master", "pid" => Process.pid, "generation" => nil }]
      mold = @refork&.mold
      list << { "role" => "mold", "pid" => mold.pid, "generation" => mold.generation } if mold
      list.each { |p| p.merge!(Memory.usage(p["pid"]) || {}) }
      workers.each do |w|
        usage = Memory.usage(w["pid"]) || {}
        w["uss_kib"] = usage["uss_kib"]
        list << { "role" => "worker", "pid" => w["pid"], "generation" => w["generation"] }.merge!(usage)
      end
      list
    end

    # A slot is read without a lock: "busy" needs the request clock running too, so a read
    # in the middle of request_done does not count a finished request as running.
    def state_name(state, running_ms)
      return "idle" if state == Native::Scoreboard::BUSY && !running_ms.positive?

      STATE_NAMES.fetch(state, "unknown")
    end
  end
end
