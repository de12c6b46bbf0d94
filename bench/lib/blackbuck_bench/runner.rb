# frozen_string_literal: true

require "fileutils"
require "tmpdir"
require "socket"
require "json"
require_relative "options"
require_relative "servers"
require_relative "server_process"
require_relative "drivers"
require_relative "procfs"
require_relative "machine"
require_relative "report"

module BlackbuckBench
  # One measurement of one cell (server, app, transport, mode) — or why there is none.
  Measurement = Struct.new(:server, :app, :transport, :mode, :rep, :status, :reason, :result,
                           :cpu_us_per_req, :server_cpu_s, :memory, keyword_init: true)

  # Boots every server for one app at a time (all listening on TCP and a UNIX socket at once),
  # then measures the cells interleaved: for each repetition, for each (transport, mode), every
  # server in turn — A B C, then C B A on the next repetition, so slow drift of the machine
  # (other builds, thermal) hits every server alike. A server that fails to boot, dies, or
  # makes the tool fail gets a failed row; the run goes on.
  class Runner
    APP_DIR = File.expand_path("../../apps", __dir__)
    ROOT = File.expand_path("../../..", __dir__)

    def initialize(opts, command:)
      @opts = opts
      @command = command
      @measurements = []
      @servers = {} # name => { summary:, status:, reason:, command:, probe: { app => ... } }
      @crosscheck = []
      @running = {}
      @last_rps = {} # server => latest measured req/s (sizes h2load's request count)
      @busy = {}     # server => CPU and time spent under its own measurements (idle check)
    end

    def run
      started = Time.now.utc
      @scratch = File.join(@opts[:out], "run-#{started.strftime('%Y%m%d-%H%M%S')}")
      FileUtils.mkdir_p(@scratch)
      @sockdir = Dir.mktmpdir("bbb") # short: sun_path is 108 bytes
      @driver = Drivers.resolve(@opts[:driver])
      log "driver: #{@driver.name}#{@driver.available? ? '' : ' (ABSENT)'}; scratch: #{@scratch}"
      machine = Machine.describe
      @opts[:apps].each { |app| run_app(app) }
      finished = Time.now.utc
      report = Report.new(opts: @opts, command: @command, machine: machine, driver: @driver,
                          servers: @servers, measurements: @measurements, crosscheck: @crosscheck,
                          started: started, finished: finished)
      paths = report.write(@opts[:out], @scratch)
      log "wrote #{paths.join(', ')} in #{(finished - started).round}s"
      report
    ensure
      @running.each_value(&:stop)
      FileUtils.rm_rf(@sockdir) if @sockdir
    end

    private

    def log(msg) = warn("[bench #{Time.now.utc.strftime('%H:%M:%S')}] #{msg}")

    def load_settings(duration = @opts[:duration])
      { threads: @opts[:threads], connections: @opts[:connections], duration: duration, timeout: @opts[:timeout] }
    end

    def run_app(app)
      @opts[:servers].each { |name| boot(name, app) }
      cells = @opts[:transports].product(@opts[:modes])
      @opts[:repeat].times do |rep|
        order = rep.even? ? @opts[:servers] : @opts[:servers].reverse
        cells.each do |transport, mode|
          order.each { |name| measure(name, app, transport, mode, rep) }
        end
      end
      crosscheck(app) if @opts[:crosscheck]
      @running.each { |name, server| record_idle_cpu(name, app, server) }
    ensure
      @running.each_value(&:stop)
      @running.clear
    end

    def server_info(recipe)
      @servers[recipe.name] ||= { "summary" => recipe.summary, "status" => "ok", "reason" => nil,
                                  "command" => nil, "probe" => {}, "failures" => {} }
    end

    def boot(name, app)
      recipe = Servers.fetch(name)
      info = server_info(recipe)
      if (why = recipe.absent_reason)
        info["status"] = "absent"
        info["reason"] = why
        log "#{name}: absent (#{why})"
        return
      end
      dir = File.join(@scratch, "#{name}-#{app}")
      FileUtils.mkdir_p(dir)
      ctx = LaunchContext.new(app_name: app, app_path: File.join(APP_DIR, "#{app}.ru"), workers: @opts[:workers],
                              tcp_port: free_port, unix_path: File.join(@sockdir, "#{name}-#{app}.sock"), dir: dir, root: ROOT)
      env = Machine.server_env(bundled: recipe.bundled?)
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      server = ServerProcess.new(recipe, ctx, env)
      server.start
      info["command"] ||= server.command_line
      info["probe"][app] = server.probe.transform_values { |p| p.transform_keys(&:to_s) }
      log "#{name}/#{app}: up in #{(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).round(1)}s " \
          "(pid #{server.pid}, body framing #{server.probe.dig('tcp', :framing)})"
      warm_up(server)
      @running[name] = server
      @busy[name] = { cpu0: Procfs.cpu_seconds(server.pid), t0: monotonic, cpu: 0.0, seconds: 0.0 }
    rescue ServerProcess::BootError, StandardError => e
      # StandardError too: a harness bug around one server must not end the whole run
      server&.stop
      @running.delete(name)
      info["failures"][app] = "boot: #{e.is_a?(ServerProcess::BootError) ? '' : "#{e.class}: "}#{e.message}"
      log "#{name}/#{app}: FAILED to boot: #{e.message}"
    end

    def warm_up(server)
      return unless @opts[:warmup].positive? && @driver.available?

      target = target_for(server, "tcp")
      scratch = File.join(server.ctx.dir, "warmup")
      FileUtils.mkdir_p(scratch)
      r = @driver.run(target, load_settings(@opts[:warmup]), keepalive: true, scratch: scratch)
      @last_rps[server.recipe.name] = r.rps if r.rps.positive?
    rescue Driver::Failed, Driver::Unsupported => e
      log "#{server.recipe.name}: warm-up: #{e.message}"
    end

    def target_for(server, transport)
      { transport: transport, tcp_port: server.ctx.tcp_port, unix_path: server.ctx.unix_path }
    end

    def measure(name, app, transport, mode, rep)
      m = Measurement.new(server: name, app: app, transport: transport, mode: mode, rep: rep)
      @measurements << m
      server = @running[name]
      unless server
        info = @servers[name]
        m.status = info["status"] == "absent" ? "absent" : "failed"
        m.reason = info["status"] == "absent" ? info["reason"] : info["failures"][app]
        return
      end
      unless server.alive?
        m.status = "failed"
        m.reason = "server exited: #{server.log_tail(4)}"
        return
      end
      measure_with(@driver, server, m)
      log format("%-13s %-13s %-4s %-9s #%d %s", name, app, transport, mode, rep + 1,
                 m.status == "ok" ? "#{m.result.rps.round} req/s, #{m.result.errors} errors" : "#{m.status}: #{m.reason}")
    end

    def measure_with(driver, server, m)
      scratch = File.join(server.ctx.dir, "#{driver.name}-#{m.transport}-#{m.mode}-#{m.rep}")
      FileUtils.mkdir_p(scratch)
      cpu0 = Procfs.cpu_seconds(server.pid)
      t0 = monotonic
      m.result = driver.run(target_for(server, m.transport), load_settings, keepalive: m.mode == "keepalive",
                                                                           scratch: scratch,
                                                                           expected_rps: @last_rps[m.server])
      @last_rps[m.server] = m.result.rps if m.result.rps.positive?
      cpu = Procfs.cpu_seconds(server.pid) - cpu0
      if (b = @busy[m.server])
        b[:cpu] += cpu
        b[:seconds] += monotonic - t0
      end
      if m.result.requests.to_i.zero?
        m.status = "failed"
        m.reason = "no request completed (#{driver.name} errors #{m.result.error_detail.to_json})"
        return m
      end
      m.memory = Procfs.worker_memory(server.pid, server.recipe.worker_re)
      m.server_cpu_s = cpu.round(3)
      m.cpu_us_per_req = m.result.requests.to_i.positive? ? (cpu * 1e6 / m.result.requests).round(1) : nil
      m.status = "ok"
      m
    rescue Driver::Unsupported => e
      m.status = "unsupported"
      m.reason = e.message
      m
    rescue Driver::Failed, StandardError => e
      m.status = "failed"
      m.reason = e.is_a?(Driver::Failed) ? e.message : "harness: #{e.class}: #{e.message}"
      m
    end

    # The same cell measured back to back by the main driver and an independent tool: wrk over
    # TCP, h2load over the UNIX socket (wrk cannot). Agreement = other / main.
    def crosscheck(app)
      server_name, cc_app, mode = @opts[:crosscheck_cell]
      return unless cc_app == app || (!@opts[:apps].include?(cc_app) && app == @opts[:apps].first)

      if server_name == "auto"
        server_name = %w[blackbuck unicorn].find { |s| @running[s] } || @running.keys.first
      end
      server = @running[server_name]
      return log("crosscheck: #{server_name} not running, skipped") unless server

      { "tcp" => "wrk", "unix" => "h2load" }.each do |transport, other_name|
        next unless @opts[:transports].include?(transport)

        other = Drivers.build(other_name)
        entry = { "server" => server_name, "app" => app, "transport" => transport, "mode" => mode,
                  "main_driver" => @driver.name, "other_driver" => other_name }
        if other.name == @driver.name || !other.available?
          entry["note"] = other.available? ? "main driver is #{other_name} already" : "#{other_name} absent"
          @crosscheck << entry
          next
        end
        runs = [@driver, other, @driver, other].each_with_index.map do |drv, i|
          mm = Measurement.new(server: server_name, app: app, transport: transport, mode: mode, rep: 100 + i)
          measure_with(drv, server, mm)
        end
        main = runs.values_at(0, 2).select { |x| x.status == "ok" }.map { |x| x.result.rps }
        oth = runs.values_at(1, 3).select { |x| x.status == "ok" }.map { |x| x.result.rps }
        entry["main_rps"] = main.map(&:round)
        entry["other_rps"] = oth.map(&:round)
        entry["other_p99_ms"] = runs.values_at(1, 3).map { |x| x.result&.p99_ms }
        entry["main_p99_ms"] = runs.values_at(0, 2).map { |x| x.result&.p99_ms }
        entry["main_tool_cpu_us_per_req"] = runs.values_at(0, 2).map { |x| x.result&.tool_cpu_us_per_req }
        entry["other_tool_cpu_us_per_req"] = runs.values_at(1, 3).map { |x| x.result&.tool_cpu_us_per_req }
        entry["failures"] = runs.reject { |x| x.status == "ok" }.map { |x| "#{x.status}: #{x.reason}" }
        if main.any? && oth.any? && main.sum.positive?
          entry["ratio"] = ((oth.sum / oth.size) / (main.sum / main.size)).round(3)
        end
        log "crosscheck #{server_name}/#{app}/#{transport}/#{mode}: #{@driver.name} #{entry['main_rps']} vs " \
            "#{other_name} #{entry['other_rps']} (ratio #{entry['ratio'].inspect})"
        @crosscheck << entry
      end
    end

    # All servers of an app are up while each one is measured, so a server that burns CPU while
    # idle (Rhebok on Ruby 3 did) would slow the others down. Record it, so the report shows it.
    IDLE_CPU_WARN_PCT = 5.0

    def record_idle_cpu(name, app, server)
      b = @busy[name] or return
      idle_s = monotonic - b[:t0] - b[:seconds]
      return unless idle_s > 1

      pct = ((Procfs.cpu_seconds(server.pid) - b[:cpu0] - b[:cpu]) / idle_s * 100).round(1)
      (@servers[name]["idle_cpu_pct"] ||= {})[app] = pct
      log "#{name}/#{app}: #{pct}% CPU while idle#{pct > IDLE_CPU_WARN_PCT ? ' — WARNING: it slows the others' : ''}"
    end

    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def free_port
      s = TCPServer.new("127.0.0.1", 0)
      s.addr[1]
    ensure
      s&.close
    end
  end
end
