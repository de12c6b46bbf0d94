# frozen_string_literal: true

require "json"
require "socket"

module Blackbuck
  # The status listener (--stats-listen ADDR), served by the master from its own loop:
  #   GET /status   JSON: every worker's scoreboard slot, listen-queue depths, totals
  #   GET /metrics  the same numbers in Prometheus text format
  # The master must never block for long here: connections are accepted non-blocking, a
  # request gets READ_DEADLINE to arrive, and every connection is closed after one answer.
  # Every answer carries MARK, so `blackbuck status` can tell this listener from an app.
  class StatusServer
    READ_DEADLINE = 0.2      # seconds a status client gets to send its request head
    WRITE_DEADLINE = 0.2     # seconds a status client gets to take the answer
    SERVE_BUDGET = 0.25      # seconds per turn of the master's loop after which no new client is taken
    MAX_PER_WAKE = 8         # connections answered per turn of the master's loop
    MAX_REQUEST_BYTES = 4096 # a longer request head is refused (the status page takes no input)
    MARK = "blackbuck-status" # response header only this listener sends; its value is FORMAT
    FORMAT = 1                # version of the /status JSON
    STATE_NAMES = Native::Scoreboard::NAMES

    attr_reader :listener

    # Binds addr and returns the server; the caller adds #io to its select.
    def self.start(addr, supervisor:, scoreboard:, listeners:, logger:, backlog: 64)
      listener = Listeners.bind(addr, backlog: backlog)
      listener.io.fcntl(Fcntl::F_SETFL, listener.io.fcntl(Fcntl::F_GETFL) | Fcntl::O_NONBLOCK)
      logger.info("status listening on #{listener.name}")
      new(listener: listener, supervisor: supervisor, scoreboard: scoreboard, listeners: listeners)
    end

    def initialize(listener:, supervisor:, scoreboard:, listeners:)
      @listener = listener
      @supervisor = supervisor
      @scoreboard = scoreboard
      @listeners = listeners
    end

    def io = @listener.io

    # Master: answer what is waiting, at most MAX_PER_WAKE connections.
    def serve
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      MAX_PER_WAKE.times do
        return if Process.clock_gettime(Process::CLOCK_MONOTONIC) - started > SERVE_BUDGET

        client, = io.accept_nonblock(exception: false)
        return if client == :wait_readable || client.nil?

        begin
          answer(client)
        rescue IOError, SystemCallError
          nil
        ensure
          client.close unless client.closed?
        end
      end
    end

    # Master: on shutdown (removes a UNIX socket file it created).
    def close = @listener.close

    # Worker, right after fork: drop the descriptor without touching the socket file.
    def close_in_child
      io.close unless io.closed?
    end

    # The whole status as one Hash (the JSON body of GET /status). A worker's "requests" are its
    # own (0 again when it is replaced); "slots" and totals.requests count every request the
    # master's workers served, those that have exited included (RequestCounts).
    def snapshot
      workers = @supervisor.children.values.sort_by(&:index).map { |c| worker_entry(c) }
      counts = @supervisor.request_counts
      slots = counts.per_slot(workers.to_h { |w| [w["index"], w["requests"]] })
      live = workers.reject { |w| w["state"] == "starting" }.map { |w| w["index"] }
      recent, seconds = counts.recent(live)
      totals = counts.totals(live)
      listeners = @listeners.map do |l|
        queued, backlog = (l.io.closed? ? nil : Native.listen_queue(l.fd))
        { "name" => l.name, "queued" => queued, "backlog" => backlog }
      end
      {
        "pid" => Process.pid,
        "version" => VERSION,
        "workers" => workers,
        "listeners" => listeners,
        "slots" => slots.map { |index, requests| { "index" => index, "requests" => requests } },
        "totals" => {
          "workers" => workers.size,
          "busy" => workers.count { |w| w["state"] == "busy" },
          "idle" => workers.count { |w| w["state"] == "idle" },
          "requests" => slots.values.sum,
          "connections" => workers.sum { |w| w["connections"] },
          "spill_bytes" => workers.sum { |w| w["spill_bytes"] },
          "queued" => listeners.sum { |l| l["queued"] || 0 },
          "shed" => totals.shed,
          "moved" => totals.moved_out
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

    # The whole-run histograms (every worker this master ran), for /metrics.
    def histograms(snap)
      live = snap["workers"].reject { |w| w["state"] == "starting" }.map { |w| w["index"] }
      @supervisor.request_counts.totals(live)
    end

    # Prometheus text exposition format (version 0.0.4).
    def metrics(snap = snapshot)
      out = +""
      family = lambda do |name, type, help, samples|
        out << "# HELP #{name} #{help}\n# TYPE #{name} #{type}\n"
        samples.each { |labels, value| out << "#{name}#{labels_text(labels)} #{value}\n" }
      end
      t = snap["totals"]
      family.call("blackbuck_workers", "gauge", "Worker processes.", [[{}, t["workers"]]])
      family.call("blackbuck_workers_busy", "gauge", "Workers running a request in the app.", [[{}, t["busy"]]])
      # A counter never decreases: per worker slot, what its exited workers served plus its live one.
      family.call("blackbuck_requests_total", "counter",
                  "Requests served since the master started, per worker slot (replaced workers included).",
                  snap["slots"].map { |s| [{ "worker" => s["index"] }, s["requests"]] })
      family.call("blackbuck_connections", "gauge", "Open client connections.", [[{}, t["connections"]]])
      family.call("blackbuck_spill_bytes", "gauge", "Bytes of responses clients have not taken, queued in spill files.",
                  snap["workers"].map { |w| [{ "worker" => w["index"] }, w["spill_bytes"]] })
      known = snap["listeners"].reject { |l| l["queued"].nil? }
      family.call("blackbuck_listen_queue", "gauge", "Connections waiting in a listener's accept queue.",
                  known.map { |l| [{ "listener" => l["name"] }, l["queued"]] })
      family.call("blackbuck_listen_backlog", "gauge", "Accept-queue limit of a listener.",
                  known.map { |l| [{ "listener" => l["name"] }, l["backlog"]] })
      totals = histograms(snap)
      histogram(out, "blackbuck_request_queue_seconds",
                "Seconds from a request's arrival (or its X-Request-Start) to the app's start.", totals.queue)
      histogram(out, "blackbuck_request_duration_seconds", "Seconds a request spent in the app and writing its answer.",
                totals.duration)
      family.call("blackbuck_requests_shed_total", "counter",
                  "Requests answered 503 because they had waited longer than max_queue_time.", [[{}, totals.shed]])
      family.call("blackbuck_connections_moved_total", "counter",
                  "Connections whose waiting request moved to a free worker while their own ran the app long.",
                  [[{}, totals.moved_out]])
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

    private

    QUANTILE_LABELS = { "p50" => "0.5", "p99" => "0.99" }.freeze

    def percentiles(hist)
      { "p50" => hist.quantile(0.5)&.round(6), "p99" => hist.quantile(0.99)&.round(6) }
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

    def worker_entry(child)
      pid, state, requests, running_ms, heartbeat_age_ms, connections, method, path, spill = @scoreboard.read(child.index)
      started = pid == child.pid # the slot is the fork's until the worker resets it
      own = started ? @supervisor.request_counts.slot_totals(child.index) : RequestCounts::Totals.empty
      {
        "index" => child.index,
        "pid" => child.pid,
        "state" => started ? state_name(state, running_ms) : "starting",
        "requests" => started ? requests : 0,
        "connections" => started ? connections : 0,
        "spill_bytes" => started ? spill : 0,
        "running_ms" => started ? running_ms : 0,
        "method" => started && running_ms.positive? ? method : nil,
        "path" => started && running_ms.positive? ? path : nil,
        "heartbeat_age_ms" => started ? heartbeat_age_ms : nil,
        # Since the worker started: its requests' wait from arrival to the app's start, and the
        # connections it moved to other workers (Native::Handoff) or took from them.
        "queue_time" => percentiles(own.queue),
        "moved_out" => own.moved_out,
        "moved_in" => own.moved_in
      }
    end

    # A slot is read without a lock: "busy" needs the request clock running too, so a read
    # in the middle of request_done does not count a finished request as running.
    def state_name(state, running_ms)
      return "idle" if state == Native::Scoreboard::BUSY && !running_ms.positive?

      STATE_NAMES.fetch(state, "unknown")
    end

    def labels_text(labels)
      return "" if labels.empty?

      "{#{labels.map { |k, v| %(#{k}="#{v.to_s.gsub(/[\\"\n]/, '\\' => '\\\\', '"' => '\\"', "\n" => '\\n')}") }.join(',')}}"
    end

    def answer(client)
      line = read_request_line(client)
      return unless line

      method, target = line.split(" ", 3)
      path = target.to_s.split("?", 2).first
      if method != "GET" && method != "HEAD"
        respond(client, 405, "text/plain", "method not allowed\n", head: false)
      elsif path == "/status"
        respond(client, 200, "application/json", "#{JSON.generate(snapshot)}\n", head: method == "HEAD")
      elsif path == "/metrics"
        respond(client, 200, "text/plain; version=0.0.4; charset=utf-8", metrics, head: method == "HEAD")
      elsif path == "/ready" # readiness: 503 until a worker serves, and from the moment a stop (or TERM's shutdown_delay) begins
        ready = @supervisor.ready?
        why = @supervisor.serving? ? "stopping\n" : "starting\n"
        respond(client, ready ? 200 : 503, "text/plain", ready ? "ready\n" : why, head: method == "HEAD")
      elsif path == "/live" # liveness: the master's loop answers this itself, so an answer means it turns
        respond(client, 200, "text/plain", "live\n", head: method == "HEAD")
      else
        respond(client, 404, "text/plain", "not found\n", head: method == "HEAD")
      end
    end

    # The request head, up to READ_DEADLINE; its first line, or nil when the client is too slow.
    def read_request_line(client)
      buf = +""
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + READ_DEADLINE
      until buf.include?("\r\n\r\n") || buf.include?("\n\n")
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        return nil if left <= 0 || buf.bytesize > MAX_REQUEST_BYTES

        chunk = client.read_nonblock(MAX_REQUEST_BYTES, exception: false)
        case chunk
        when :wait_readable then IO.select([client], nil, nil, left)
        when nil then break # EOF: answer what we have
        else buf << chunk
        end
      end
      buf[/\A[^\r\n]+/]
    end

    REASONS = { 200 => "OK", 404 => "Not Found", 405 => "Method Not Allowed", 503 => "Service Unavailable" }.freeze

    # Writes the answer; a client that does not take it within WRITE_DEADLINE loses it.
    def respond(client, code, type, body, head:)
      out = "HTTP/1.1 #{code} #{REASONS[code]}\r\ncontent-type: #{type}\r\ncontent-length: #{body.bytesize}\r\n" \
            "#{MARK}: #{FORMAT}\r\nconnection: close\r\n\r\n#{body unless head}"
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + WRITE_DEADLINE
      until out.empty?
        n = client.write_nonblock(out, exception: false)
        if n == :wait_writable
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return if left <= 0

          IO.select(nil, [client], nil, left)
        else
          out = out.byteslice(n..)
        end
      end
    end
  end
end
