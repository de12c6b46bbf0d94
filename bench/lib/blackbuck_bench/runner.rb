# frozen_string_literal: true

require "etc"
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
require_relative "plan"
require_relative "stats"
require_relative "memory"
require_relative "streams"
require_relative "local"

module BlackbuckBench
  # One measurement of one cell (server, workload, transport, mode) — or why there is none.
  # app holds the workload's name (a workload is an app plus a load shape).
  Measurement = Struct.new(:server, :app, :transport, :mode, :rep, :status, :reason, :result,
                           :cpu_us_per_req, :server_cpu_s, :memory, :balance, :streams, keyword_init: true) do
    # The server cannot run here: this measurement and the server's info (the report's) say why.
    def absent!(info, why)
      info["status"] = "absent"
      info["reason"] = why
      self.status = "absent"
      self.reason = why
      self
    end
  end

  # A booted server, and the nginx in front of it when the workload has one.
  Running = Struct.new(:server, :front, :stats_dir, :workers, keyword_init: true) do
    def terminate
      front&.terminate
      server.terminate
    end

    def stop
      front&.stop
      server.stop
    end

    # where the load tool connects: the front when there is one
    def entry = front || server
  end

  # Boots every server for one workload at a time (all listening on TCP and a UNIX socket at
  # once, BOOT_PARALLEL at a time), then measures the cells interleaved: for each repetition, for
  # each (transport, mode), every server in turn — A B C, then C B A on the next repetition, so
  # slow drift of the machine (other builds, thermal) hits every server alike. A server that
  # fails to boot, dies, or makes the tool fail gets a failed row; the run goes on.
  class Runner
    include Local

    ROOT = File.expand_path("../../..", __dir__)
    BOOT_PARALLEL = 4 # servers booting at once: boots are CPU-bound, and 2 cores are shared

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
      @sockseq = 0
      @scratch = File.join(@opts[:out], "run-#{started.strftime('%Y%m%d-%H%M%S')}")
      FileUtils.mkdir_p(@scratch)
      @sockdir = Dir.mktmpdir("bbb") # short: sun_path is 108 bytes
      # the apps' per-worker counts: on tmpfs, where a write costs ~20 µs, not ~250 µs as on
      # this machine's disk (bench_stats.rb writes every 10 ms under load)
      @statsdir = Dir.mktmpdir("bbstats", File.writable?("/dev/shm") ? "/dev/shm" : Dir.tmpdir)
      @driver = Drivers.resolve(@opts[:driver])
      log "driver: #{@driver.name}#{@driver.available? ? '' : ' (ABSENT)'}; scratch: #{@scratch}"
      steps = Plan.build(@opts)
      estimate = Plan.estimate(steps, @opts)
      log Plan.describe(steps, @opts)
      machine = Machine.describe
      start_cpu_hogs if @opts[:cpu_hog]
      steps.each { |step| run_step(step) }
      finished = Time.now.utc
      report = Report.new(opts: @opts, command: @command, machine: machine, driver: @driver,
                          servers: @servers, measurements: @measurements, crosscheck: @crosscheck,
                          started: started, finished: finished, plan: steps, estimate: estimate)
      paths = report.write(@opts[:out], @scratch)
      log "wrote #{paths.join(', ')} in #{(finished - started).round}s"
      report
    ensure
      @running.each_value(&:stop)
      stop_cpu_hogs
      FileUtils.rm_rf(@sockdir) if @sockdir
      FileUtils.rm_rf(@statsdir) if @statsdir
    end

    private

    def log(msg) = warn("[bench #{Time.now.utc.strftime('%H:%M:%S')}] #{msg}")

    # --cpu-hog: one `yes > /dev/null` per core for the whole run, so every server shares the CPU
    # with something that always wants it (the load average the report gives is taken before).
    def start_cpu_hogs
      @hogs = Array.new(Etc.nprocessors) { Process.spawn("yes", out: File::NULL, err: File::NULL) }
      log "beside #{@hogs.size} CPU hogs (yes > /dev/null): pids #{@hogs.join(' ')}"
    end

    def stop_cpu_hogs
      (@hogs || []).each do |pid|
        Process.kill(:TERM, pid)
        Process.wait(pid)
      rescue SystemCallError
        nil
      end
      @hogs = nil
    end

    def load_settings(step, duration = step.duration)
      { threads: @opts[:threads], connections: step.connections, duration: duration, timeout: @opts[:timeout],
        targets: step.workload.targets }
    end

    # The workload's own load tool, or the run's.
    def step_driver
      name = @step.workload.driver
      return @driver unless name && name != @driver.name

      @drivers ||= {}
      @drivers[name] ||= Drivers.build(name)
    end

    def run_step(step)
      @step = step
      return run_memory_step(step) if step.workload.memory?
      return run_streams_step(step) if step.workload.streams?

      app = step.workload.name
      step.servers.each_slice(BOOT_PARALLEL) do |batch|
        booting = batch.filter_map { |name| spawn_server(name, step) }
        booting.each { |b| finish_boot(b, step) }
      end
      @running.each do |name, r|
        warm_up(r, step)
        # idle CPU is counted from here: boot and warm-up are not idle
        @busy[name] = { cpu0: Procfs.cpu_seconds(r.server.pid), t0: monotonic, cpu: 0.0, seconds: 0.0 }
      end
      @opts[:repeat].times do |rep|
        order = rep.even? ? step.servers : step.servers.reverse
        step.cells.each do |transport, mode|
          order.each do |name|
            measure(name, app, transport, mode, rep) if step.cells_for(name).include?([transport, mode])
          end
        end
      end
      crosscheck(step) if @opts[:crosscheck]
      @running.each { |name, r| record_idle_cpu(name, app, r.server) }
    ensure
      @running.each_value(&:terminate)
      @running.each_value(&:stop)
      @running.clear
    end

    # One server at a time, its own procedure (memory.rb).
    def run_memory_step(step)
      @measurements.concat(MemoryStep.new(step: step, scratch: @scratch, sockdir: @sockdir, log: method(:log),
                                          info: method(:server_info)).run)
    end

    # One server at a time, its own procedure (streams.rb).
    def run_streams_step(step)
      @measurements.concat(StreamsStep.new(step: step, scratch: @scratch, sockdir: @sockdir, stats_root: @statsdir,
                                           warmup_s: @opts[:warmup], log: method(:log), info: method(:server_info)).run)
    end

    def server_info(recipe)
      @servers[recipe.name] ||= { "summary" => recipe.summary, "status" => "ok", "reason" => nil,
                                  "command" => nil, "probe" => {}, "failures" => {}, "runtime" => {} }
    end

    # Starts one server (and no waiting): => [name, ServerProcess, Running, spawn time] or nil.
    def spawn_server(name, step)
      recipe = Servers.fetch(name)
      info = server_info(recipe)
      if (why = recipe.absent_reason)
        info["status"] = "absent"
        info["reason"] = why
        log "#{name}: absent (#{why})"
        return nil
      end
      w = step.workload
      dir = File.join(@scratch, "#{name}-#{w.name}")
      stats = File.join(@statsdir, "#{name}-#{w.name}")
      FileUtils.mkdir_p([dir, stats])
      ctx = LaunchContext.new(app_name: w.app, app_path: w.app_path, workers: step.workers, tcp_port: free_port,
                              unix_path: File.join(@sockdir, "#{@sockseq = @sockseq.to_i + 1}.sock"), dir: dir, root: ROOT)
      server = ServerProcess.new(recipe, ctx, server_env(recipe, w, stats))
      server.spawn
      [name, server, Running.new(server: server, stats_dir: stats, workers: step.workers), monotonic]
    rescue StandardError => e
      boot_failed(name, w&.name, server, e)
      nil
    end

    def server_env(recipe, workload, stats_dir)
      extra = recipe.env.merge("BENCH_STATS_DIR" => stats_dir)
      return Machine.server_env(bundled: recipe.bundled?, extra: extra) unless workload.rails

      rails = RailsStack.for(ServerRuby.current)
      Machine.server_env(bundled: recipe.bundled?, gemfile: (rails.gemfile if recipe.bundled?),
                         preload: (rails.preload unless recipe.bundled?), extra: extra.merge(rails.env))
    end

    def finish_boot((name, server, running, t0), step)
      app = step.workload.name
      info = @servers[name]
      server.wait_ready
      info["command"] ||= server.command_line
      info["probe"][app] = server.probe.transform_values { |p| p.transform_keys(&:to_s) }
      running.front = start_front(server) if step.workload.front
      log "#{name}/#{app}: up in #{(monotonic - t0).round(1)}s (pid #{server.pid}, body framing " \
          "#{server.probe.dig('tcp', :framing)}#{running.front ? ", behind nginx pid #{running.front.pid}" : ''})"
      @running[name] = running
    rescue ServerProcess::BootError, StandardError => e
      # StandardError too: a harness bug around one server must not end the whole run
      running&.front&.stop
      boot_failed(name, app, server, e)
    end

    def boot_failed(name, app, server, error)
      server&.stop
      @running.delete(name)
      msg = "boot: #{error.is_a?(ServerProcess::BootError) ? '' : "#{error.class}: "}#{error.message}"
      @servers[name]["failures"][app] = msg if @servers[name]
      log "#{name}/#{app}: FAILED to boot: #{error.message}"
    end

    # nginx in front of the server's UNIX socket (the production shape).
    def start_front(server)
      dir = File.join(server.ctx.dir, "nginx-front")
      FileUtils.mkdir_p(dir)
      ctx = LaunchContext.new(app_name: server.ctx.app_name, app_path: server.ctx.app_path, workers: 1,
                              tcp_port: free_port, unix_path: "#{server.ctx.unix_path}.front", dir: dir, root: ROOT,
                              upstream: server.ctx.unix_path)
      front = ServerProcess.new(Servers::FRONT, ctx, Machine.server_env(bundled: false))
      front.spawn
      front.wait_ready
      front
    rescue ServerProcess::BootError
      front&.stop
      raise
    end

    def warm_up(running, step)
      # a workload with its own tool (h2load) needs a measured rate to size its request count:
      # warm it up even when --warmup is 0 (bench:quick)
      seconds = step.workload.driver ? [@opts[:warmup], Plan::MIN_RATE_WARMUP_S].max : @opts[:warmup]
      return unless seconds.positive? && @driver.available?

      transport, = step.cells.first
      entry = running.entry
      scratch = File.join(running.server.ctx.dir, "warmup")
      FileUtils.mkdir_p(scratch)
      r = @driver.run(target_for(entry, transport), load_settings(step, seconds), keepalive: true, scratch: scratch)
      @last_rps[running.server.recipe.name] = r.rps if r.rps.positive?
    rescue Driver::Failed, Driver::Unsupported => e
      log "#{running.server.recipe.name}: warm-up: #{e.message}"
    end

    def target_for(process, transport)
      { transport: transport, tcp_port: process.ctx.tcp_port, unix_path: process.ctx.unix_path }
    end

    def measure(name, app, transport, mode, rep)
      m = Measurement.new(server: name, app: app, transport: transport, mode: mode, rep: rep)
      @measurements << m
      running = @running[name]
      unless running
        info = @servers[name]
        m.status = info["status"] == "absent" ? "absent" : "failed"
        m.reason = info["status"] == "absent" ? info["reason"] : info["failures"][app]
        return
      end
      dead = [running.server, running.front].compact.reject(&:alive?)
      unless dead.empty?
        m.status = "failed"
        m.reason = "#{dead.first.recipe.name} exited: #{dead.first.log_tail(4)}"
        return
      end
      measure_with(step_driver, running, m)
      log format("%-16s %-12s %-4s %-9s #%d %s", name, app, transport, mode, rep + 1, summary(m))
    end

    def summary(m)
      return "#{m.status}: #{m.reason}" unless m.status == "ok"

      out = +"#{m.result.rps.round} req/s, #{m.result.errors} errors"
      (m.result.classes || {}).each { |c, x| out << ", #{c} p99 #{x['p99_ms']&.round(1)} ms" }
      out << ", busiest worker #{m.balance['busiest_share_pct']}%" if m.balance
      out
    end

    def measure_with(driver, running, m)
      server = running.server
      scratch = File.join(server.ctx.dir, "#{driver.name}-#{m.transport}-#{m.mode}-#{m.rep}")
      FileUtils.mkdir_p(scratch)
      stats0 = Stats.read(running.stats_dir)
      cpu0 = Procfs.cpu_seconds(server.pid)
      t0 = monotonic
      m.result = driver.run(target_for(running.entry, m.transport), load_settings(@step),
                            keepalive: m.mode == "keepalive", scratch: scratch, expected_rps: @last_rps[m.server])
      @last_rps[m.server] = m.result.rps if m.result.rps.positive?
      cpu = Procfs.cpu_seconds(server.pid) - cpu0
      m.result.classes = m.result.classes&.transform_keys { |path| @step.workload.class_name(path) }
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
      sleep Stats::SETTLE_S
      m.balance = Stats.balance(stats0, Stats.read(running.stats_dir), running.workers)
      runtime = Stats.facts(running.stats_dir)
      @servers[m.server]["runtime"][m.app] = runtime unless runtime.empty?
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
    def crosscheck(step)
      app = step.workload.name
      server_name, cc_app, mode = @opts[:crosscheck_cell]
      return if step.workload.mixed? # wrk and h2load have no per-class targets
      return unless cc_app == app || (!@opts[:workloads].include?(cc_app) && app == @opts[:workloads].first)

      if server_name == "auto"
        server_name = %w[blackbuck unicorn].find { |s| @running[s] } || @running.keys.first
      end
      running = @running[server_name]
      return log("crosscheck: #{server_name} not running, skipped") unless running

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
          measure_with(drv, running, mm)
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
  end
end
