# frozen_string_literal: true

require "json"
require "fileutils"
require "time"
require "open3"
require_relative "machine"
require_relative "workloads"
require_relative "memory"
require_relative "streams"

module BlackbuckBench
  # Turns measurements into rows (median and spread per cell, ratios within the run) and writes
  # latest.json, latest.md and latest.png. Every requested cell gets a row, including absent
  # and failed servers, with the reason. Rows are keyed by workload ("app" holds its name).
  class Report
    RATIO_BASES = { "unicorn" => "unicorn", "nginx" => "nginx" }.freeze
    TABLES_BEGIN = "<!-- bench:tables:begin -->"
    TABLES_END = "<!-- bench:tables:end -->"
    MODE_LABEL = { "keepalive" => "keep-alive", "close" => "conn/request" }.freeze
    README = File.expand_path("../../README.md", __dir__)
    README_BEGIN = "<!-- bench:last-full-run:begin -->"
    README_END = "<!-- bench:last-full-run:end -->"

    attr_reader :rows, :servers

    # The peers a row is compared with: every server but Blackbuck (any variant) and nginx.
    def self.peer?(server) = !server.start_with?("blackbuck") && !%w[nginx].include?(server)

    def initialize(opts:, command:, machine:, driver:, servers:, measurements:, crosscheck:, started:, finished:,
                   plan: [], estimate: nil)
      @plan = plan
      @estimate = estimate
      @opts = opts
      @command = command
      @machine = machine
      @driver = driver
      @servers = servers
      @measurements = measurements
      @crosscheck = crosscheck
      @started = started
      @finished = finished
      @rows = build_rows
    end

    def write(out_dir, scratch)
      FileUtils.mkdir_p(out_dir)
      json = File.join(out_dir, "latest.json")
      md = File.join(out_dir, "latest.md")
      png = File.join(out_dir, "latest.png")
      File.write(json, JSON.pretty_generate(document) + "\n")
      chart_error = Chart.new(self).write(png, scratch)
      @chart_error = chart_error
      File.write(md, markdown)
      [json, md, png].each { |f| FileUtils.cp(f, scratch) if File.exist?(f) }
      # only a full run replaces the README's section (not quick, not a BENCH_ONLY subset, not --out)
      update_readme(png) unless @opts[:quick] || @opts[:only] || @opts[:out] != File.expand_path("../../results", __dir__)
      [json, md, png]
    end

    def machine_line = Machine.short(@machine)

    def load_line
      "#{@driver.name} -t #{@opts[:threads]} -c #{@opts[:connections]}, #{fmt_num(@opts[:duration])} s x " \
        "#{@opts[:repeat]} interleaved runs per cell, #{@opts[:workers]} workers per server " \
        "(mixed: #{MIXED_WORKERS} workers, #{MIXED_TARGETS.sum { |t| t['weight'] }} connections; iowait and mixed " \
        "#{[MIXED_DURATION_S, @opts[:quick] ? @opts[:duration] : MIXED_DURATION_S].min} s)" \
        "#{'; beside a CPU hog: one busy process (yes) per core for the whole run' if @opts[:cpu_hog]}"
    end

    def title_line
      "#{@started.strftime('%Y-%m-%d %H:%M UTC')} — #{machine_line}"
    end

    def document
      {
        "started" => @started.iso8601, "finished" => @finished.iso8601,
        "duration_s" => (@finished - @started).round,
        "command" => @command, "quick" => @opts[:quick], "machine" => @machine,
        "load" => load_settings,
        "matrix" => { "servers" => @opts[:servers], "workloads" => @opts[:workloads], "only" => @opts[:only],
                      "transports" => @opts[:transports], "modes" => @opts[:modes], "workers" => @opts[:workers],
                      "repeat" => @opts[:repeat] },
        "plan" => @plan.map do |s|
          { "workload" => s.workload.name, "app" => s.workload.app, "servers" => s.servers, "cells" => s.cells,
            "workers" => s.workers, "connections" => s.connections, "duration_s" => s.duration,
            "streams" => s.shape && s.shape.to_h.transform_keys(&:to_s).merge("bound_s" => s.shape.bound_s),
            "targets" => s.workload.targets, "front" => s.workload.front }
        end,
        "estimate" => @estimate,
        "servers" => @servers,
        "crosscheck" => @crosscheck,
        "memory_targets" => memory_targets,
        "streams_targets" => streams_targets,
        "rows" => @rows
      }
    end

    def load_settings
      { "driver" => @driver.name, "threads" => @opts[:threads], "connections" => @opts[:connections],
        "duration_s" => @opts[:duration], "warmup_s" => @opts[:warmup], "timeout_s" => @opts[:timeout] }
    end

    private

    def median(values)
      v = values.compact.sort
      return nil if v.empty?

      v.size.odd? ? v[v.size / 2] : (v[v.size / 2 - 1] + v[v.size / 2]) / 2.0
    end

    def build_rows
      groups = @measurements.group_by { |m| [m.server, m.app, m.transport, m.mode] }
      rows = groups.map { |key, ms| row(*key, ms.select { |m| m.rep < 100 }) }
      index = rows.to_h { |r| [[r["server"], r["app"], r["transport"], r["mode"]], r] }
      rows.each do |r|
        RATIO_BASES.each do |label, base|
          b = index[[base, r["app"], r["transport"], r["mode"]]]
          r["x_#{label}"] = r["rps"] && b && b["rps"]&.positive? ? (r["rps"].to_f / b["rps"]).round(2) : nil
        end
      end
      rows.group_by { |r| [r["app"], r["transport"], r["mode"]] }.each_value { |cell| best_peer_ratios(cell) }
      workloads = @plan.map { |s| s.workload.name }
      workloads = @opts[:workloads] if workloads.empty?
      servers = @opts[:servers]
      order = ->(r) { [workloads.index(r["app"]) || 99, @opts[:transports].index(r["transport"]),
                       @opts[:modes].index(r["mode"]), servers.index(r["server"]) || 99] }
      rows.sort_by(&order)
    end

    # x_best: req/s over the best peer's (the fastest server that is not Blackbuck or nginx) in
    # the same cell; for mixed workloads also fast_p99_x_best: the fast class's p99 over the
    # lowest peer p99 (> 1 = slower than the best peer).
    def best_peer_ratios(cell)
      peers = cell.select { |r| Report.peer?(r["server"]) && r["rps"]&.positive? }
      best = peers.max_by { |r| r["rps"] }
      fast = peers.select { |r| r.dig("classes", "fast", "p99_ms")&.positive? }.min_by { |r| r.dig("classes", "fast", "p99_ms") }
      cell.each do |r|
        r["best_peer"] = best && best["server"]
        r["x_best"] = best && r["rps"] ? (r["rps"].to_f / best["rps"]).round(2) : nil
        next unless r["classes"]

        r["best_peer_fast_p99"] = fast && fast["server"]
        mine = r.dig("classes", "fast", "p99_ms")
        r["fast_p99_x_best"] = fast && mine ? (mine.to_f / fast.dig("classes", "fast", "p99_ms")).round(2) : nil
      end
    end

    def row(server, app, transport, mode, ms)
      ok = ms.select { |m| m.status == "ok" }
      bad = ms.reject { |m| m.status == "ok" }
      rps = ok.map { |m| m.result.rps }
      status = if ok.size == ms.size then "ok"
               elsif ok.any? then "partial"
               else bad.first&.status || "failed"
               end
      mem = ok.map(&:memory).compact
      bal = ok.map(&:balance).compact
      med = median(rps)
      step = @plan.find { |s| s.workload.name == app }
      {
        "server" => server, "app" => app, "transport" => transport, "mode" => mode,
        "workers" => step ? step.workers : @opts[:workers], "status" => status,
        "reason" => bad.map(&:reason).compact.uniq.first,
        "rps" => med&.round(1),
        "rps_min" => rps.min&.round(1), "rps_max" => rps.max&.round(1),
        # one run has no spread (n/a), not a spread of 0
        "spread_pct" => med&.positive? && rps.size > 1 ? ((rps.max - rps.min) / med * 100).round(1) : nil,
        "runs" => ok.size,
        "p50_ms" => median(ok.map { |m| m.result.p50_ms })&.round(3),
        "p99_ms" => median(ok.map { |m| m.result.p99_ms })&.round(3),
        "classes" => classes(ok),
        "server_cpu_us_per_req" => median(ok.map(&:cpu_us_per_req))&.round(1),
        "load_tool_cpu_us_per_req" => median(ok.map { |m| m.result.tool_cpu_us_per_req })&.round(1),
        "rss_kb_per_worker" => median(mem.map { |x| x[:rss_kb_per_worker] })&.round,
        "pss_kb_per_worker" => median(mem.map { |x| x[:pss_kb_per_worker] })&.round,
        "workers_seen" => mem.map { |x| x[:workers_seen] }.max,
        "busiest_share_pct" => median(bal.map { |b| b["busiest_share_pct"] })&.round(1),
        "workers_serving" => bal.map { |b| b["workers_serving"] }.min,
        "balance_runs" => bal.map { |b| b["per_worker"] },
        "errors" => ok.sum { |m| m.result.errors.to_i },
        "error_detail" => ok.each_with_object(Hash.new(0)) { |m, h| m.result.error_detail.each { |k, v| h[k] += v } },
        "requests" => ok.sum { |m| m.result.requests.to_i },
        "rps_runs" => rps.map { |x| x.round(1) },
        "load" => load_settings.merge("command" => ok.first&.result&.command)
      }.merge(memory_fields(mem.first)).merge(streams_fields(ok.first))
    end

    # The streams workload's figures (StreamsStep): the stream client's summary, the fast load
    # alone, memory before, at the peak and at the end.
    def streams_fields(m) = m&.streams ? { "streams" => m.streams } : {}

    def streams_targets
      rows = @rows.select { |r| r["streams"] }.to_h { |r| [r["server"], r["streams"]] }
      rows.empty? ? [] : Streams.evaluate(rows)
    end

    # The memory workload's figures (MemoryStep): smaps summary, warm-up, RUBYOPT and LD_PRELOAD.
    def memory_fields(mem)
      return {} unless mem&.key?(:smaps)

      { "memory" => mem[:smaps].merge("warm_up" => mem[:warm], "rubyopt" => mem[:ruby_opts], "ld_preload" => mem[:ld_preload]) }
    end

    # { server => memory summary } of the measured memory rows, for Memory.evaluate
    def memory_summaries = @rows.select { |r| r["memory"] }.to_h { |r| [r["server"], r["memory"]] }

    def memory_targets = memory_summaries.empty? ? [] : Memory.evaluate(memory_summaries)

    # Per class (mixed workloads): medians of the runs' req/s, p50 and p99; max = the largest of
    # the runs' maxima; errors summed.
    def classes(ok)
      runs = ok.map { |m| m.result.classes }.compact
      return nil if runs.empty?

      runs.flat_map(&:keys).uniq.to_h do |name|
        each = runs.map { |c| c[name] }.compact
        [name, { "rps" => median(each.map { |c| c["rps"] })&.round(1),
                 "p50_ms" => median(each.map { |c| c["p50_ms"] })&.round(3),
                 "p99_ms" => median(each.map { |c| c["p99_ms"] })&.round(3),
                 "max_ms" => each.map { |c| c["max_ms"] }.compact.max&.round(3),
                 "requests" => each.sum { |c| c["requests"].to_i },
                 "connections" => each.first["connections"],
                 "errors" => each.sum { |c| c["errors"].to_i } }]
      end
    end

    def fmt_num(v, digits = 0)
      return "–" if v.nil?
      return v.to_s if v.is_a?(Integer) && digits.zero?

      s = format("%.#{digits}f", v)
      digits.zero? ? s.reverse.scan(/\d{1,3}/).join(",").reverse : s
    end

    def fmt_int(v) = v.nil? ? "–" : v.round.to_s.reverse.scan(/\d{1,3}/).join(",").reverse

    def fmt_ratio(v) = v.nil? ? "" : format("%.2f", v)

    def markdown
      out = +"# Blackbuck benchmark — #{@opts[:quick] ? 'quick (CI) run' : 'full run'}\n\n"
      out << "- **When:** #{@started.strftime('%Y-%m-%d %H:%M UTC')} (#{(@finished - @started).round} s)\n"
      out << "- **Machine:** #{machine_line}; load average at start #{@machine['loadavg_at_start']}\n"
      out << "- **Command:** `#{@command}`\n"
      out << "- **Load:** #{load_line}, request timeout #{@opts[:timeout]} s, warm-up #{fmt_num(@opts[:warmup], 1)} s after boot\n"
      out << "- **Versions:** #{(@machine['versions'] || {}).map { |k, v| "#{k}: #{v}" }.join('; ')}\n\n"
      out << "req/s is the median of the runs; spread = (max − min) / median. p50/p99 are medians of the runs' " \
             "percentiles (mixed: per class; max = the largest of the runs). CPU = server processes' utime+stime " \
             "(from /proc) / requests. PSS = mean per worker process (copy-on-write pages shared fairly). Busiest " \
             "worker = its share of the requests the app counted in each worker (median of the runs; " \
             "100/N % is perfect balance, 100 % one worker did all) and how many of the N workers served any. " \
             "×best peer: ratio to the fastest server that is not Blackbuck or nginx in the same cell of this " \
             "run (named under each table); ×nginx: to nginx `return 200`.\n\n"
      out << tables_md
      out << "\n" << problems_md << crosscheck_md << servers_md
      out << "\nChart: `latest.png`#{@chart_error ? " — not drawn: #{@chart_error}" : ''}. Method and fairness notes: bench/README.md.\n"
      out
    end

    def tables_md
      out = +"#{TABLES_BEGIN}\n"
      @rows.group_by { |r| r["app"] }.each do |app, rows|
        w = WORKLOADS.find { |x| x.name == app }
        step = @plan.find { |x| x.workload.name == app }
        out << "### #{app} — #{w ? w.title : app}\n\n"
        if w&.memory?
          out << memory_md(rows, step)
          next
        end
        if w&.streams?
          out << streams_md(rows, step)
          next
        end
        out << "#{step.workers} workers, #{step.connections} connections, #{fmt_num(step.duration, 1)} s x #{@opts[:repeat]} runs\n\n" if step
        out << (w&.mixed? ? mixed_table(rows) : plain_table(rows))
        bests = rows.map { |r| [r["transport"], r["mode"], r["best_peer"]] }.uniq.select(&:last)
        out << "\nBest peer by req/s: #{bests.map { |t, m, b| "#{t} #{MODE_LABEL[m]} #{b}" }.join('; ')}." if bests.any?
        fast = rows.map { |r| r["best_peer_fast_p99"] }.compact.uniq
        out << " Best peer by the fast class's p99: #{fast.join(', ')}." if fast.any?
        out << "\n" if bests.any? || fast.any?
        out << "\n"
      end
      out << "#{TABLES_END}\n\n"
    end

    def measured?(r) = %w[ok partial].include?(r["status"])

    def rps_cell(r) = fmt_int(r["rps"]) + (r["status"] == "partial" ? " (partial)" : "")

    def busiest(r)
      return "–" unless r["busiest_share_pct"]

      "#{fmt_num(r['busiest_share_pct'], 0)}% (#{r['workers_serving']}/#{r['workers']})"
    end

    # "12.5%"; "n/a" for a cell measured once (--repeat 1, --quick): one run has no spread.
    def spread_cell(r)
      return "n/a" if r["runs"] == 1

      r["spread_pct"] ? "#{r['spread_pct']}%" : "–"
    end

    def plain_table(rows)
      out = +"| Server | Transport | Mode | req/s | spread | p50 ms | p99 ms | CPU µs/req | PSS KB/worker | busiest worker | errors | ×best peer | ×nginx |\n"
      out << "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
      rows.each do |r|
        cells = if measured?(r)
                  [rps_cell(r), spread_cell(r), fmt_num(r["p50_ms"], 2),
                   fmt_num(r["p99_ms"], 2), fmt_num(r["server_cpu_us_per_req"], 1), fmt_int(r["pss_kb_per_worker"]),
                   busiest(r), fmt_int(r["errors"]), fmt_ratio(r["x_best"]), fmt_ratio(r["x_nginx"])]
                else
                  ["**#{r['status']}**"] + [""] * 9
                end
        out << "| #{r['server']} | #{r['transport']} | #{MODE_LABEL[r['mode']]} | #{cells.join(' | ')} |\n"
      end
      out
    end

    # The memory workload: one table of figures, then the issue's targets with pass/fail.
    def memory_md(rows, step)
      out = +"#{step&.workers} workers of 1 thread per server, one server at a time: boot, warm-up of " \
             "#{fmt_int(MemoryStep::WARM_REQUESTS)} requests spread over the #{MemoryRailsApp.endpoints.size} pages " \
             "(blackbuck-load, #{step&.connections} keep-alive connections, UNIX socket), req/s over every page for " \
             "#{fmt_num(step&.duration, 0)} s, then /proc/PID/smaps_rollup of every process of the server's tree. " \
             "USS = Private_Clean + Private_Dirty (what the process alone costs); shared = (Shared_Clean + " \
             "Shared_Dirty) / Rss; total PSS = every process (master, workers, molds). Read when every worker has " \
             "served #{fmt_num(MemoryStep::MIN_SERVED_S, 0)} s under load since its fork (1 s top-ups of the same load until then: " \
             "a worker a refork has just made owns almost nothing yet); served = the youngest worker's. Measured once per row.\n\n"
      out << "| Server | USS KB/worker | USS min–max | PSS KB/worker | shared % | total PSS KB | processes | req/s | warm-up requests | served s (top-ups) | errors | RUBYOPT |\n"
      out << "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n"
      rows.each do |r|
        m = r["memory"]
        unless measured?(r) && m
          out << "| #{r['server']} | **#{r['status']}** | #{r['reason'].to_s.gsub('|', '/')[0, 160]} | | | | | | | | | |\n"
          next
        end
        errors = r["errors"].to_i + m.dig("warm_up", "errors").to_i
        out << "| #{r['server']} | #{fmt_int(m['uss_kb_per_worker'])} | #{fmt_int(m['uss_kb_min'])}–#{fmt_int(m['uss_kb_max'])} | " \
               "#{fmt_int(m['pss_kb_per_worker'])} | #{fmt_num(m['shared_pct_per_worker'], 1)} | #{fmt_int(m['total_pss_kb'])} | " \
               "#{m['processes'].size} (#{m['workers_seen']} workers) | #{fmt_int(r['rps'])} | " \
               "#{fmt_int(m.dig('warm_up', 'requests'))} | #{fmt_num(m.dig('warm_up', 'youngest_worker_served_s'), 1)} " \
               "(#{m.dig('warm_up', 'top_ups') || 0}) | #{fmt_int(errors)} | #{m['rubyopt'] ? "`#{m['rubyopt']}`" : '–'} |\n"
      end
      out << "\n" << memory_targets_md
    end

    # The streams workload: one row per server, then issue 35's targets with pass/fail.
    def streams_md(rows, step)
      sh = step&.shape || STREAMS_SHAPE
      out = +"#{step&.workers} workers per server, one server at a time. The stream client (bench/lib/blackbuck_bench/sse_client.rb, " \
             "one Ruby process, TCP) opens #{fmt_int(sh.streams)} streams of GET /sse evenly over #{fmt_num(sh.ramp_s, 1)} s, each " \
             "#{sh.events} events #{sh.interval_ms} ms apart, and closes what is still open #{fmt_num(sh.bound_s, 0)} s after its " \
             "start; complete = status 200, every event, and the response's proper end. First event = from the stream's due " \
             "time (its intended start) to its first event; p99 over every stream requested (> bound: more than 1% had none). " \
             "Fast = blackbuck-load, #{step&.connections} keep-alive connections on GET / over TCP for #{fmt_num(step&.duration, 1)} s " \
             "from the ramp's end; alone = the same load before the streams. PSS/stream = (total PSS of the server's processes " \
             "at the fast load's end − before the streams) / streams requested; end = smaps when the client has finished. " \
             "Measured once per row.\n\n"
      out << "| Server | streams complete | first event p50 ms | first event p99 ms | fast req/s | fast p99 ms | fast p99 alone ms | fast p99 with / without | " \
             "PSS KB/stream | end total PSS KB | end USS KB/worker | fast errors | client CPU s |\n"
      out << "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
      rows.each do |r|
        st = r["streams"]
        unless measured?(r) && st
          out << "| #{r['server']} | **#{r['status']}** | #{r['reason'].to_s.gsub('|', '/')[0, 160]} | | | | | | | | | | |\n"
          next
        end
        c = st["clients"] || {}
        ttfe99 = c["ttfe_p99_ms"] ? fmt_num(c["ttfe_p99_ms"], 1) : "> #{fmt_num(sh.bound_s, 0)} s"
        ending = st["memory_end"] || {}
        out << "| #{r['server']} | #{fmt_int(st['completed'])} / #{fmt_int(st['requested'])} | " \
               "#{c['ttfe_p50_ms'] ? fmt_num(c['ttfe_p50_ms'], 1) : "> #{fmt_num(sh.bound_s, 0)} s"} | #{ttfe99} | " \
               "#{fmt_int(r['rps'])} | #{st['fast_requests']&.zero? ? 'none done' : fmt_num(r['p99_ms'], 2)} | " \
               "#{fmt_num(st.dig('fast_alone', 'p99_ms'), 2)} | " \
               "#{fmt_ratio(st['fast_p99_ratio'])} | #{fmt_num(st['pss_kb_per_stream'], 1)} | #{fmt_int(ending['total_pss_kb'])} | " \
               "#{fmt_int(ending['uss_kb_per_worker'])} | #{fmt_int(r['errors'])} | #{fmt_num(st['client_cpu_s'], 1)} |\n"
      end
      failures = rows.filter_map do |r|
        f = r.dig("streams", "clients", "failures")
        "#{r['server']}: #{f.map { |k, v| "#{v} #{k}" }.join(', ')}" if f&.any?
      end
      out << "\nStreams not complete: #{failures.join('; ')}.\n" if failures.any?
      out << "\n" << streams_targets_md
    end

    def streams_targets_md
      out = +"Targets (issue 35; rows of this run):\n\n| Target | Row | Against | Value | Limit | Result |\n|---|---|---|--:|--:|---|\n"
      streams_targets.each do |t|
        result = if t["pass"].nil? then "n/a (#{t['missing']})"
                 else t["pass"] ? "**pass**" : "**FAIL**"
                 end
        value = t["value"].is_a?(Float) ? format("%.2f", t["value"]) : fmt_int(t["value"])
        value = t["note"] if t["note"]
        limit = t["label"].start_with?("all streams") ? "= #{fmt_int(t['limit'])}" : "≤ #{t['limit']}"
        out << "| #{t['label']} | #{t['server']} | #{t['peer'] || '–'} | #{value} | #{limit} | #{result} |\n"
      end
      out << "\n"
    end

    def memory_targets_md
      out = +"Targets (issues 24 and 34; ratios of rows of this run, the same allocator on both sides unless a comparison says otherwise):\n\n| Target | Blackbuck row | Peer row | Metric | Ratio | Limit | Result |\n|---|---|---|---|--:|--:|---|\n"
      memory_targets.each do |t|
        result = if t["missing"] then "n/a (#{t['missing']} not measured)"
                 elsif t["limit"].nil? then "comparison"
                 else t["pass"] ? "**pass**" : "**FAIL**"
                 end
        out << "| #{t['label']} | #{t['server']} | #{t['base']} | #{t['metric']} | " \
               "#{t['ratio'] ? format('%.2f', t['ratio']) : '–'} | #{t['limit'] ? "≤ #{t['limit']}" : '–'} | #{result} |\n"
      end
      out << "\n"
    end

    def mixed_table(rows)
      out = +"| Server | Transport | req/s | fast req/s | fast p50 ms | fast p99 ms | fast max ms | slow p50 ms | slow p99 ms | CPU µs/req | PSS KB/worker | busiest worker | errors | fast p99 ×best peer |\n"
      out << "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
      rows.each do |r|
        f = r.dig("classes", "fast") || {}
        sl = r.dig("classes", "slow") || {}
        cells = if measured?(r)
                  [rps_cell(r), fmt_int(f["rps"]), fmt_num(f["p50_ms"], 2), fmt_num(f["p99_ms"], 2), fmt_num(f["max_ms"], 1),
                   fmt_num(sl["p50_ms"], 1), fmt_num(sl["p99_ms"], 1), fmt_num(r["server_cpu_us_per_req"], 1),
                   fmt_int(r["pss_kb_per_worker"]), busiest(r), fmt_int(r["errors"]), fmt_ratio(r["fast_p99_x_best"])]
                else
                  ["**#{r['status']}**"] + [""] * 11
                end
        out << "| #{r['server']} | #{r['transport']} #{MODE_LABEL[r['mode']]} | #{cells.join(' | ')} |\n"
      end
      out
    end

    def problems_md
      notes = @servers.filter_map do |name, s|
        if s["status"] == "absent"
          "- **#{name}: absent** — #{s['reason']}"
        elsif s["failures"].any?
          s["failures"].map { |app, why| "- **#{name}** (#{app}): #{why}" }.join("\n")
        end
      end
      @servers.each do |name, s|
        (s["idle_cpu_pct"] || {}).each do |app, pct|
          notes << "- **#{name}** (#{app}) used #{pct}% CPU while idle (others were measured meanwhile)" if pct > Runner::IDLE_CPU_WARN_PCT
        end
      end
      @rows.each do |r|
        next if %w[ok absent].include?(r["status"]) || r["reason"].nil?
        next if @servers.dig(r["server"], "failures", r["app"])

        notes << "- #{r['server']} #{r['app']} #{r['transport']} #{r['mode']}: #{r['status']}: #{r['reason']}"
      end
      errs = @rows.select { |r| r["errors"].to_i.positive? }
      errs.each do |r|
        notes << "- #{r['server']} #{r['app']} #{r['transport']} #{r['mode']}: errors #{r['error_detail'].to_json}"
      end
      notes.empty? ? "" : "## Absent, failed, errors\n\n#{notes.join("\n")}\n\n"
    end

    def crosscheck_md
      return "" if @crosscheck.empty?

      out = +"## Cross-check of the load tool\n\nSame server and cell, measured back to back (main, other, main, other). " \
              "Ratio = other tool's mean req/s / main tool's. The tools use CPU on the same cores as the server " \
              "(tool CPU per request, from the tool process's rusage), so a cheaper tool leaves more to the server.\n\n"
      out << "| Cell | Main tool req/s | Other tool req/s | Ratio | p99 ms main / other | tool CPU µs/req main / other |\n" \
             "|---|--:|--:|--:|--:|--:|\n"
      @crosscheck.each do |c|
        cell = "#{c['server']} #{c['app']} #{c['transport']} #{MODE_LABEL[c['mode']]}"
        if c["note"]
          out << "| #{cell} | #{c['main_driver']} | #{c['other_driver']} | – | #{c['note']} | |\n"
        else
          p99 = "#{c['main_p99_ms'].compact.map { |x| fmt_num(x, 2) }.join(', ')} / #{c['other_p99_ms'].compact.map { |x| fmt_num(x, 2) }.join(', ')}"
          out << "| #{cell} | #{c['main_driver']}: #{c['main_rps'].map { |x| fmt_int(x) }.join(', ')} | " \
                 "#{c['other_driver']}: #{c['other_rps'].map { |x| fmt_int(x) }.join(', ')} | " \
                 "#{c['ratio'] ? format('%.2f', c['ratio']) : '–'} | #{p99} | #{tool_cpu(c)} |\n"
          c["failures"].each { |f| out << "| ↳ #{f} | | | | | |\n" } if c["failures"]&.any?
        end
      end
      out << "\n"
    end

    def tool_cpu(c)
      f = ->(xs) { Array(xs).compact.map { |x| fmt_num(x, 1) }.join(", ") }
      "#{f.call(c['main_tool_cpu_us_per_req'])} / #{f.call(c['other_tool_cpu_us_per_req'])}"
    end

    def servers_md
      out = +"## Servers as run\n\n" \
              "Runtime = what the workers themselves reported (bench/apps/lib/bench_stats.rb): server version, Ruby, " \
              "Rack, YJIT.\n\n" \
              "| Server | Configuration | Keeps connections alive | Body framing (hello) | Runtime | CPU while idle |\n|---|---|---|---|---|--:|\n"
      @servers.each do |name, s|
        framing = s["probe"].select { |app, _| app.start_with?("hello") }.map { |app, p| "#{app}: #{p.dig('tcp', 'framing') || '?'}" }.join(", ")
        ka = s["probe"].values.map { |p| p.dig("tcp", "keepalive") }.compact.uniq
        ka = ka.empty? ? "?" : ka.map { |k| k ? "yes" : "no (closes)" }.join("/")
        idle = (s["idle_cpu_pct"] || {}).values.max
        out << "| #{name} | #{s['summary']} | #{s['status'] == 'absent' ? '' : ka} | " \
               "#{s['status'] == 'absent' ? "absent: #{s['reason']}" : framing} | #{runtime(s)} | #{idle ? "#{idle}%" : '–'} |\n"
      end
      out
    end

    # "puma 8.0.2, Ruby 3.1.2, Rack 3.2.8, YJIT" (Rails rows: their own Rack, shown after them)
    def runtime(s)
      (s["runtime"] || {}).flat_map { |app, facts| facts.map { |f| [app, f] } }
                          .group_by { |_, f| f }.map do |f, apps|
        text = "#{f['server']}, Ruby #{f['ruby']}, Rack #{f['rack']}#{f['yjit'] ? ', YJIT' : ''}"
        apps.size < (s["runtime"] || {}).size ? "#{text} (#{apps.map(&:first).join(', ')})" : text
      end.join("; ")
    end

    def update_readme(png, readme = README)
      return unless File.exist?(readme)

      text = File.read(readme)
      return unless text.include?(README_BEGIN) && text.include?(README_END)

      FileUtils.cp(png, File.join(File.dirname(png), "full.png")) if File.exist?(png)
      block = +"#{README_BEGIN}\n"
      block << "_Generated by `bench/run.rb` at the end of a full run; do not edit by hand._\n\n"
      block << "- Machine: #{machine_line}\n- Command: `#{@command}`\n- Load: #{load_line}\n\n"
      block << "![one panel per workload: req/s, and the fast requests' p99 for the mixed ones](results/full.png)\n\n"
      block << tables_md.sub("#{TABLES_BEGIN}\n", "").sub("#{TABLES_END}\n\n", "") << README_END
      File.write(readme, text.sub(/#{Regexp.escape(README_BEGIN)}.*#{Regexp.escape(README_END)}/m) { block })
    end
  end

  # The chart: one panel per workload, one group of bars per server, one bar per cell (TCP and
  # UNIX socket, each keep-alive and connection-per-request), error bars = min..max of the runs.
  # Mixed workloads plot the fast class's p99 instead (log scale, lower is better).
  # Drawn by gnuplot (gnuplot-nox, installed by bench/setup).
  class Chart
    COLORS = { %w[tcp keepalive] => "#1f77b4", %w[tcp close] => "#9ecae1",
               %w[unix keepalive] => "#d62728", %w[unix close] => "#ff9896" }.freeze
    LABEL = { "tcp" => "TCP 127.0.0.1", "unix" => "UNIX socket" }.freeze
    PX_PER_SERVER = 95
    MIXED_FLOOR_MS = 0.1 # the log axis starts here; a server without a number sits on it

    def initialize(report)
      @report = report
      @rows = report.rows
    end

    # => nil, or why the chart could not be drawn
    def write(png, scratch)
      gnuplot = ENV.fetch("PATH", "").split(":").map { |d| File.join(d, "gnuplot") }.find { |p| File.executable?(p) }
      return "gnuplot not found (run bench/setup)" unless gnuplot

      apps = @rows.map { |r| r["app"] }.uniq
      dir = File.join(scratch, "chart")
      FileUtils.mkdir_p(dir)
      panels = apps.map do |app|
        rows = @rows.select { |r| r["app"] == app }
        servers = rows.map { |r| r["server"] }.uniq
        if memory?(app)
          File.write(File.join(dir, "#{app}.dat"), memory_data(rows))
          memory_panel(app, File.join(dir, "#{app}.dat"))
        elsif mixed?(app)
          File.write(File.join(dir, "#{app}.dat"), mixed_data(app, servers))
          mixed_panel(app, File.join(dir, "#{app}.dat"))
        else
          series = COLORS.keys.select { |t, m| rows.any? { |r| r["transport"] == t && r["mode"] == m } }
          File.write(File.join(dir, "#{app}.dat"), data(app, servers, series))
          rps_panel(app, File.join(dir, "#{app}.dat"), series)
        end
      end
      widest = apps.map { |a| @rows.count { |r| r["app"] == a } }.max.to_i
      script = gnuplot_script(png, panels, [900, PX_PER_SERVER * widest + 250].max)
      File.write(File.join(dir, "chart.gp"), script)
      out, status = Open3.capture2e(gnuplot, File.join(dir, "chart.gp"))
      status.success? ? nil : "gnuplot failed: #{out.lines.first(3).join.strip}"
    end

    private

    def mixed?(app) = WORKLOADS.find { |w| w.name == app }&.mixed?

    def label_for(server, app)
      rs = @rows.select { |r| r["server"] == server && r["app"] == app }
      if rs.any? { |r| %w[ok partial].include?(r["status"]) }
        closes = @report.servers.dig(server, "probe", app, "tcp", "keepalive") == false
        return closes ? "#{server}\\n(no keep-alive)" : server
      end

      "#{server}\\n(#{rs.first&.dig('status') || 'absent'})"
    end

    def data(app, servers, series)
      lines = servers.map do |s|
        vals = series.flat_map do |t, m|
          r = @rows.find { |x| x["server"] == s && x["app"] == app && x["transport"] == t && x["mode"] == m }
          r && r["rps"] ? [r["rps"], r["rps_min"], r["rps_max"]] : [0, 0, 0]
        end
        "\"#{label_for(s, app)}\" #{vals.join(' ')}"
      end
      "# server #{series.map { |t, m| "#{t}-#{m}(median min max)" }.join(' ')}\n#{lines.join("\n")}\n"
    end

    # fast p99 (median of the runs), and its smallest and largest run values are not kept per
    # class, so the whiskers are p50 .. max of the fast class
    def mixed_data(app, servers)
      lines = servers.map do |s|
        r = @rows.find { |x| x["server"] == s && x["app"] == app }
        f = r&.dig("classes", "fast")
        vals = f && f["p99_ms"] ? [f["p99_ms"], f["p50_ms"] || f["p99_ms"], f["max_ms"] || f["p99_ms"]] : [MIXED_FLOOR_MS] * 3
        "\"#{label_for(s, app)}\" #{vals.join(' ')}"
      end
      "# server fast-p99 fast-p50 fast-max (ms)\n#{lines.join("\n")}\n"
    end

    def rps_panel(app, file, series)
      using = series.each_with_index.map do |(t, m), i|
        c = 2 + i * 3
        title = "#{LABEL[t]}, #{m == 'keepalive' ? 'keep-alive' : 'connection per request'}"
        %("#{file}" using #{c}:#{c + 1}:#{c + 2}#{i.zero? ? ':xtic(1)' : ''} title "#{title}" lc rgb "#{COLORS[[t, m]]}")
      end
      <<~GP
        unset logscale y
        set yrange [0:*]
        set ylabel "requests/s (higher is better)"
        set format y "%.0s%c"
        set title "#{app_title(app)}" font ",13"
        plot #{using.join(", \\\n     ")}
      GP
    end

    def memory?(app) = WORKLOADS.find { |w| w.name == app }&.memory?

    # The memory panel: MB per worker, USS (whiskers: the smallest and largest worker) and PSS.
    def memory_data(rows)
      lines = rows.map do |r|
        m = r["memory"]
        mb = ->(kb) { kb ? (kb / 1024.0).round(1) : 0 }
        vals = m ? [m["uss_kb_per_worker"], m["uss_kb_min"], m["uss_kb_max"]].map(&mb) + [mb.call(m["pss_kb_per_worker"])] * 3 : [0] * 6
        "\"#{label_for(r['server'], r['app'])}\" #{vals.join(' ')}"
      end
      "# server uss(mean min max) pss(mean mean mean), MB per worker\n#{lines.join("\n")}\n"
    end

    def memory_panel(app, file)
      <<~GP
        unset logscale y
        set yrange [0:*]
        set ylabel "MB per worker (lower is better)"
        set format y "%g"
        set xtics rotate by -30
        set title "#{app_title(app)}" font ",13"
        plot "#{file}" using 2:3:4:xtic(1) title "USS per worker (whiskers: min–max)" lc rgb "#9467bd", \\
             "#{file}" using 5:6:7 title "PSS per worker" lc rgb "#c5b0d5"
        set xtics norotate
      GP
    end

    def mixed_panel(app, file)
      <<~GP
        set logscale y
        set yrange [#{MIXED_FLOOR_MS}:*]
        set ylabel "fast requests' p99, ms (lower is better; whiskers p50..max)"
        set format y "%g"
        set title "#{app_title(app)}" font ",13"
        plot "#{file}" using 2:3:4:xtic(1) title "fast class p99 (UNIX socket, keep-alive)" lc rgb "#2ca02c"
      GP
    end

    def gnuplot_script(png, panels, width)
      height = 480 * panels.size + 90
      <<~GP
        set terminal pngcairo size #{width},#{height} font "DejaVu Sans,11" noenhanced
        set output "#{png}"
        set multiplot layout #{panels.size},1 title "Bars: median of the runs, whiskers: min–max (mixed: p50–max)\\n#{gp_text(@report.title_line)}\\n#{gp_text(@report.load_line)}" font ",12"
        set style data histogram
        set style histogram errorbars gap 1.5 lw 1
        set style fill solid 0.9 border -1
        set boxwidth 0.9
        set grid ytics lc rgb "#dddddd"
        set key outside bottom center horizontal maxrows 2 font ",10"
        set xtics nomirror font ",10"
        set ytics nomirror
        set border 3
        set bmargin 7
        set tmargin 3
        #{panels.join("\n")}
        unset multiplot
      GP
    end

    def app_title(app) = WORKLOADS.find { |w| w.name == app }&.title || app

    # Text inside a gnuplot double-quoted string: gnuplot runs what is between backquotes as a shell
    # command, and a double quote or backslash would end or bend the string.
    def gp_text(text) = text.tr("`", "'").gsub(/["\\]/) { |c| "\\#{c}" }
  end
end
