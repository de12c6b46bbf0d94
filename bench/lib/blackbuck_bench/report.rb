# frozen_string_literal: true

require "json"
require "fileutils"
require "time"
require "open3"
require_relative "machine"

module BlackbuckBench
  # Turns measurements into rows (median and spread per cell, ratios within the run) and writes
  # latest.json, latest.md and latest.png. Every requested cell gets a row, including absent
  # and failed servers, with the reason.
  class Report
    RATIO_BASES = { "unicorn" => "unicorn", "puma" => "puma", "nginx" => "nginx" }.freeze
    MODE_LABEL = { "keepalive" => "keep-alive", "close" => "conn/request" }.freeze
    README = File.expand_path("../../README.md", __dir__)
    README_BEGIN = "<!-- bench:last-full-run:begin -->"
    README_END = "<!-- bench:last-full-run:end -->"

    attr_reader :rows, :servers

    def initialize(opts:, command:, machine:, driver:, servers:, measurements:, crosscheck:, started:, finished:)
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
      update_readme(png) unless @opts[:quick] || @opts[:out] != File.expand_path("../../results", __dir__)
      [json, md, png]
    end

    def machine_line = Machine.short(@machine)

    def load_line
      "#{@driver.name} -t #{@opts[:threads]} -c #{@opts[:connections]}, #{fmt_num(@opts[:duration])} s x " \
        "#{@opts[:repeat]} interleaved runs per cell, #{@opts[:workers]} workers per server"
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
        "matrix" => { "servers" => @opts[:servers], "apps" => @opts[:apps], "transports" => @opts[:transports],
                      "modes" => @opts[:modes], "workers" => @opts[:workers], "repeat" => @opts[:repeat] },
        "servers" => @servers,
        "crosscheck" => @crosscheck,
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
          r["x_#{label}"] = r["rps"] && b && b["rps"]&.positive? ? (r["rps"] / b["rps"]).round(2) : nil
        end
      end
      order = ->(r) { [@opts[:apps].index(r["app"]), @opts[:transports].index(r["transport"]),
                       @opts[:modes].index(r["mode"]), @opts[:servers].index(r["server"])] }
      rows.sort_by(&order)
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
      med = median(rps)
      {
        "server" => server, "app" => app, "transport" => transport, "mode" => mode,
        "workers" => @opts[:workers], "status" => status,
        "reason" => bad.map(&:reason).compact.uniq.first,
        "rps" => med&.round(1),
        "rps_min" => rps.min&.round(1), "rps_max" => rps.max&.round(1),
        "spread_pct" => med&.positive? ? ((rps.max - rps.min) / med * 100).round(1) : nil,
        "runs" => ok.size,
        "p50_ms" => median(ok.map { |m| m.result.p50_ms })&.round(3),
        "p99_ms" => median(ok.map { |m| m.result.p99_ms })&.round(3),
        "server_cpu_us_per_req" => median(ok.map(&:cpu_us_per_req))&.round(1),
        "load_tool_cpu_us_per_req" => median(ok.map { |m| m.result.tool_cpu_us_per_req })&.round(1),
        "rss_kb_per_worker" => median(mem.map { |x| x[:rss_kb_per_worker] })&.round,
        "pss_kb_per_worker" => median(mem.map { |x| x[:pss_kb_per_worker] })&.round,
        "workers_seen" => mem.map { |x| x[:workers_seen] }.max,
        "errors" => ok.sum { |m| m.result.errors.to_i },
        "error_detail" => ok.each_with_object(Hash.new(0)) { |m, h| m.result.error_detail.each { |k, v| h[k] += v } },
        "requests" => ok.sum { |m| m.result.requests.to_i },
        "rps_runs" => rps.map { |x| x.round(1) },
        "load" => load_settings.merge("command" => ok.first&.result&.command)
      }
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
      out << "- **Versions:** #{@machine['versions'].map { |k, v| "#{k}: #{v}" }.join('; ')}\n\n"
      out << "req/s is the median of the runs; spread = (max − min) / median. p50/p99 are medians of the runs' " \
             "percentiles. CPU = server processes' utime+stime (from /proc) / requests. RSS = mean per worker " \
             "process. ×Unicorn, ×Puma, ×nginx: ratio of medians to that server in the same cell of this run.\n\n"
      out << "| Server | App | Transport | Mode | req/s | spread | p50 ms | p99 ms | CPU µs/req | RSS KB/worker | errors | ×Unicorn | ×Puma | ×nginx |\n"
      out << "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
      @rows.each do |r|
        cells = if %w[ok partial].include?(r["status"])
                  [fmt_int(r["rps"]) + (r["status"] == "partial" ? " (partial)" : ""),
                   r["spread_pct"] ? "#{r['spread_pct']}%" : "–", fmt_num(r["p50_ms"], 2), fmt_num(r["p99_ms"], 2),
                   fmt_num(r["server_cpu_us_per_req"], 1), fmt_int(r["rss_kb_per_worker"]), fmt_int(r["errors"]),
                   fmt_ratio(r["x_unicorn"]), fmt_ratio(r["x_puma"]), fmt_ratio(r["x_nginx"])]
                else
                  ["**#{r['status']}**", "", "", "", "", "", "", "", "", ""]
                end
        out << "| #{r['server']} | #{r['app']} | #{r['transport']} | #{MODE_LABEL[r['mode']]} | #{cells.join(' | ')} |\n"
      end
      out << "\n" << problems_md << crosscheck_md << servers_md
      out << "\nChart: `latest.png`#{@chart_error ? " — not drawn: #{@chart_error}" : ''}. Method and fairness notes: bench/README.md.\n"
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
      out = +"## Servers as run\n\n| Server | Configuration | Keeps connections alive | Body framing (per app) | CPU while idle |\n|---|---|---|---|--:|\n"
      @servers.each do |name, s|
        framing = s["probe"].map { |app, p| "#{app}: #{p.dig('tcp', 'framing') || '?'}" }.join(", ")
        ka = s["probe"].values.map { |p| p.dig("tcp", "keepalive") }.compact.uniq
        ka = ka.empty? ? "?" : ka.map { |k| k ? "yes" : "no (closes)" }.join("/")
        idle = (s["idle_cpu_pct"] || {}).values.max
        out << "| #{name} | #{s['summary']} | #{s['status'] == 'absent' ? '' : ka} | " \
               "#{s['status'] == 'absent' ? "absent: #{s['reason']}" : framing} | #{idle ? "#{idle}%" : '–'} |\n"
      end
      out
    end

    def update_readme(png)
      return unless File.exist?(README)

      text = File.read(README)
      return unless text.include?(README_BEGIN) && text.include?(README_END)

      FileUtils.cp(png, File.join(File.dirname(png), "full.png")) if File.exist?(png)
      block = +"#{README_BEGIN}\n"
      block << "_Generated by `bench/run.rb` at the end of a full run; do not edit by hand._\n\n"
      block << "- Machine: #{machine_line}\n- Command: `#{@command}`\n- Load: #{load_line}\n\n"
      block << "![requests per second](results/full.png)\n\n"
      table = markdown[/^\| Server \| App .*?\n(?=\n)/m]
      block << table.to_s << "\n#{README_END}"
      File.write(README, text.sub(/#{Regexp.escape(README_BEGIN)}.*#{Regexp.escape(README_END)}/m) { block })
    end
  end

  # The chart: one panel per app, one group of bars per server, four bars per group (TCP and
  # UNIX socket, each keep-alive and connection-per-request), error bars = min..max of the runs.
  # Drawn by gnuplot (gnuplot-nox, installed by bench/setup).
  class Chart
    COLORS = { %w[tcp keepalive] => "#1f77b4", %w[tcp close] => "#9ecae1",
               %w[unix keepalive] => "#d62728", %w[unix close] => "#ff9896" }.freeze
    LABEL = { "tcp" => "TCP 127.0.0.1", "unix" => "UNIX socket" }.freeze

    def initialize(report)
      @report = report
      @rows = report.rows
    end

    # => nil, or why the chart could not be drawn
    def write(png, scratch)
      gnuplot = ENV.fetch("PATH", "").split(":").map { |d| File.join(d, "gnuplot") }.find { |p| File.executable?(p) }
      return "gnuplot not found (run bench/setup)" unless gnuplot

      apps = @rows.map { |r| r["app"] }.uniq
      servers = @rows.map { |r| r["server"] }.uniq
      series = COLORS.keys.select { |t, m| @rows.any? { |r| r["transport"] == t && r["mode"] == m } }
      dir = File.join(scratch, "chart")
      FileUtils.mkdir_p(dir)
      apps.each { |app| File.write(File.join(dir, "#{app}.dat"), data(app, servers, series)) }
      script = gnuplot_script(png, dir, apps, servers, series)
      File.write(File.join(dir, "chart.gp"), script)
      out, status = Open3.capture2e(gnuplot, File.join(dir, "chart.gp"))
      status.success? ? nil : "gnuplot failed: #{out.lines.first(3).join.strip}"
    end

    private

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

    def gnuplot_script(png, dir, apps, servers, series)
      cols = apps.size > 1 ? 2 : 1
      nrows = (apps.size + cols - 1) / cols
      width = [900, 130 * servers.size + 250].max * cols
      height = 520 * nrows + 90
      plot_cmds = apps.map do |app|
        file = File.join(dir, "#{app}.dat")
        using = series.each_with_index.map do |(t, m), i|
          c = 2 + i * 3
          title = "#{LABEL[t]}, #{m == 'keepalive' ? 'keep-alive' : 'connection per request'}"
          %("#{file}" using #{c}:#{c + 1}:#{c + 2}#{i.zero? ? ':xtic(1)' : ''} title "#{title}" lc rgb "#{COLORS[[t, m]]}")
        end
        <<~GP
          set title "#{app_title(app)}" font ",13"
          plot #{using.join(", \\\n     ")}
        GP
      end
      <<~GP
        set terminal pngcairo size #{width},#{height} font "DejaVu Sans,11" noenhanced
        set output "#{png}"
        set multiplot layout #{nrows},#{cols} title "Requests per second, higher is better (bars: median, whiskers: min–max of the runs)\\n#{@report.title_line}\\n#{@report.load_line}" font ",12"
        set style data histogram
        set style histogram errorbars gap 1.5 lw 1
        set style fill solid 0.9 border -1
        set boxwidth 0.9
        set ylabel "requests/s"
        set yrange [0:*]
        set format y "%.0s%c"
        set grid ytics lc rgb "#dddddd"
        set key outside bottom center horizontal maxrows 2 font ",10"
        set xtics nomirror font ",11"
        set ytics nomirror
        set border 3
        set bmargin 7
        set tmargin 3
        #{plot_cmds.join("\n")}
        unset multiplot
      GP
    end

    def app_title(app)
      {
        "hello" => "hello world, no Content-Length (seed app: chunked or close-delimited)",
        "hello_length" => "hello world with Content-Length",
        "sinatra" => "Sinatra hello (Debian ruby-sinatra)",
        "big" => "64 KiB response"
      }.fetch(app, app)
    end
  end
end
