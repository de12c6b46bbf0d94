# frozen_string_literal: true

require "fileutils"
require "json"
require "socket"
require_relative "procfs"
require_relative "servers"
require_relative "server_process"
require_relative "drivers"
require_relative "machine"
require_relative "local"

module BlackbuckBench
  # The memory workload's arithmetic (issue 24): what one /proc/PID/smaps_rollup says, what a
  # server's process tree costs, and the issue's targets as ratios between rows of one run. Pure
  # functions over text and hashes, tested in bench/test without a server.
  module Memory
    # One process of a server's tree. role: "master" (the tree's root), "worker" (its title
    # matches the recipe's worker_re) or "other" (a mold, a refork's intermediate, a helper).
    # USS = Private_Clean + Private_Dirty: what exiting it would give back. Shared = the pages it
    # shares with another process (Shared_Clean + Shared_Dirty), as a share of its Rss.
    # age_s: seconds since the process was forked (a worker that has not served yet owns almost
    # nothing: MemoryStep reads again until every worker has served a while).
    Proc = Struct.new(:pid, :role, :title, :rss_kb, :pss_kb, :uss_kb, :shared_kb, :age_s, keyword_init: true) do
      def shared_pct = rss_kb.positive? ? shared_kb * 100.0 / rss_kb : 0.0

      def to_h = super.merge(shared_pct: shared_pct.round(1)).transform_keys(&:to_s)
    end

    module_function

    # smaps_rollup's "Name:   123 kB" lines => { "Name" => 123 }; the header line is skipped.
    def parse_smaps(text)
      text.scan(/^(\w+):\s+(\d+) kB$/).to_h { |k, v| [k, v.to_i] }
    end

    def proc_from_smaps(pid, role, title, fields, age_s: nil)
      Proc.new(pid: pid, role: role, title: title, age_s: age_s, rss_kb: fields.fetch("Rss", 0), pss_kb: fields.fetch("Pss", 0),
               uss_kb: fields.fetch("Private_Clean", 0) + fields.fetch("Private_Dirty", 0),
               shared_kb: fields.fetch("Shared_Clean", 0) + fields.fetch("Shared_Dirty", 0))
    end

    # Every live process of the tree rooted at root_pid, read once. Without worker_re (servers
    # whose workers keep the master's title) every process but the root is a worker.
    def sample(root_pid, worker_re)
      Procfs.tree(root_pid).filter_map do |p|
        text = File.read("/proc/#{p.pid}/smaps_rollup")
        role = if p.pid == root_pid then "master"
               elsif worker_re.nil? || p.cmdline.match?(worker_re) then "worker"
               else "other"
               end
        proc_from_smaps(p.pid, role, p.cmdline[0, 80], parse_smaps(text), age_s: age_s(p.pid))
      rescue Errno::ENOENT, Errno::ESRCH, Errno::EACCES
        nil # exited between the listing and the read (a refork's short-lived process)
      end
    end

    # Seconds since pid started: /proc/uptime minus its starttime (field 22 of /proc/PID/stat, in
    # clock ticks since boot).
    def age_s(pid, uptime: File.read("/proc/uptime").split.first.to_f)
      raw = File.read("/proc/#{pid}/stat")
      start_ticks = raw[(raw.rindex(")") + 2)..].split(" ")[19].to_i
      (uptime - start_ticks.to_f / Procfs::CLK_TCK).round(2)
    end

    # The youngest worker's age, or nil without workers.
    def youngest_worker_age_s(procs) = procs.select { |p| p.role == "worker" }.filter_map(&:age_s).min

    # What the report shows of one server: per worker USS (mean, min, max), PSS and shared %
    # (means), and the PSS of every process of the tree added up (what the server costs the
    # machine: master, workers, molds).
    def summarize(procs)
      workers = procs.select { |p| p.role == "worker" }
      mean = ->(xs) { xs.empty? ? nil : (xs.sum.to_f / xs.size).round }
      {
        "workers_seen" => workers.size,
        "uss_kb_per_worker" => mean.call(workers.map(&:uss_kb)),
        "uss_kb_min" => workers.map(&:uss_kb).min,
        "uss_kb_max" => workers.map(&:uss_kb).max,
        "pss_kb_per_worker" => mean.call(workers.map(&:pss_kb)),
        "rss_kb_per_worker" => mean.call(workers.map(&:rss_kb)),
        "shared_pct_per_worker" => workers.empty? ? nil : (workers.sum(&:shared_pct) / workers.size).round(1),
        "total_pss_kb" => procs.sum(&:pss_kb),
        "youngest_worker_age_s" => youngest_worker_age_s(procs),
        "processes" => procs.map(&:to_h)
      }
    end

    # The issues' targets: Blackbuck's row over a peer's, for one metric, at most `limit`, rows of
    # the same run. Issue 34: the same allocator on both sides of each ratio, so every limit is
    # checked twice, both rows on glibc and both on jemalloc (LD_PRELOAD of Debian's libjemalloc2;
    # blackbuck-warmup-refork-jemalloc gets the same library by its `jemalloc true` directive,
    # which restarts the command with it in LD_PRELOAD), and with YJIT both rows with YJIT at the
    # same settings. A target without a limit is a comparison only, shown beside them: DEPLOY.md's
    # whole advice against Pitchfork on glibc as it runs by default (issue 24's way of reading its
    # limits: not the same allocator), and YJIT's 64 MiB code region on both sides.
    Target = Struct.new(:label, :server, :base, :metric, :limit, keyword_init: true)

    # [label, Blackbuck row, peer row, metric, limit], each on glibc (as named) and on jemalloc
    LIMITS = [
      ["reforking alone: USS per worker", "blackbuck-refork", "pitchfork-refork", "uss_kb_per_worker", 0.8],
      ["warmup + refork: USS per worker", "blackbuck-warmup-refork", "pitchfork-refork", "uss_kb_per_worker", 0.65],
      ["warmup + refork: total PSS", "blackbuck-warmup-refork", "pitchfork-refork", "total_pss_kb", 0.8],
      ["warmup + refork, YJIT: total PSS", "blackbuck-warmup-refork+yjit", "pitchfork-refork+yjit", "total_pss_kb", 0.7],
      ["defaults: USS per worker", "blackbuck-defaults", "unicorn-preload", "uss_kb_per_worker", 1.0]
    ].freeze

    # The row's name on jemalloc: -jemalloc before a YJIT suffix (the names Servers::MEMORY makes).
    def self.on_jemalloc(name) = name.sub(/(\+yjit\d*)?\z/) { "-jemalloc#{Regexp.last_match(1)}" }

    TARGETS = (LIMITS.flat_map do |label, server, base, metric, limit|
      [Target.new(label: "#{label} (glibc, both)", server: server, base: base, metric: metric, limit: limit),
       Target.new(label: "#{label} (jemalloc, both)", server: on_jemalloc(server), base: on_jemalloc(base),
                  metric: metric, limit: limit)]
    end + [
      Target.new(label: "(comparison) warmup + refork + jemalloc against Pitchfork on glibc: USS per worker",
                 server: "blackbuck-warmup-refork-jemalloc", base: "pitchfork-refork", metric: "uss_kb_per_worker"),
      Target.new(label: "(comparison) warmup + refork + jemalloc against Pitchfork on glibc: total PSS",
                 server: "blackbuck-warmup-refork-jemalloc", base: "pitchfork-refork", metric: "total_pss_kb"),
      Target.new(label: "(comparison) warmup + refork, YJIT 64 MiB, jemalloc, both: total PSS",
                 server: "blackbuck-warmup-refork-jemalloc+yjit64", base: "pitchfork-refork-jemalloc+yjit64",
                 metric: "total_pss_kb")
    ]).freeze

    # summaries: { server name => summarize(...) } of the rows measured. => one hash per target;
    # "pass" is nil (and "missing" names why) when either row has no figure.
    def evaluate(summaries, targets = TARGETS)
      targets.map do |t|
        mine = summaries.dig(t.server, t.metric)
        theirs = summaries.dig(t.base, t.metric)
        out = { "label" => t.label, "server" => t.server, "base" => t.base, "metric" => t.metric, "limit" => t.limit,
                "value" => mine, "base_value" => theirs }
        if mine && theirs&.positive?
          ratio = mine.to_f / theirs
          out.merge("ratio" => ratio.round(3), "pass" => t.limit ? ratio <= t.limit : nil)
        else
          out.merge("ratio" => nil, "pass" => nil,
                    "missing" => [mine ? nil : t.server, theirs ? nil : t.base].compact.join(" and "))
        end
      end
    end
  end
end

module BlackbuckBench
  # The memory workload's procedure, one server at a time (a Rails app with 4 workers per server
  # is ~0.5-1 GB; booted together they would also share the 2 cores during each other's warm-up):
  # boot, warm up with WARM_REQUESTS requests spread over every page, wait for a refork the
  # recipe promises, measure req/s for the workload's duration over every page, then read every
  # process's smaps_rollup (after the load: every worker has then served traffic since its last
  # fork, reforked or not), then stop. Measured once: memory after a fixed warm-up does not need
  # the interleaved repetitions that req/s does, and a row costs ~30 s.
  class MemoryStep
    include Local

    WARM_REQUESTS = 6_000  # the issue's warm-up: ~65 requests per page, ~1,500 per worker
    WARM_CHUNK_S = 3       # the warm-up runs the load tool in chunks until WARM_REQUESTS are done
    WARM_MAX_S = 120       # ... or this long has passed (a slow server is read with what it served)
    BOOT_TIMEOUT_S = 120   # Rails boot with 4 workers (and Blackbuck's warmup requests) on 2 cores
    REFORK_WAIT_S = 60     # a promised refork (Puma's fork_worker) must be over within this
    # A worker forked moments ago (a refork's new generation) has served nothing and owns almost
    # nothing: its USS says nothing about the server. smaps is read again after TOP_UP_S more of
    # the same load until every worker has served MIN_SERVED_S under load (at most MAX_TOP_UPS
    # times; the row records how many and the youngest worker's serving time). A server caught in
    # the middle of a refork (a worker retired, its replacement not forked yet: Pitchfork with YJIT
    # was read so once, with 3 workers and a fresh mold) is read again after a top-up too.
    MIN_SERVED_S = 3.0
    TOP_UP_S = 1
    MAX_TOP_UPS = 15

    # collaborators: the run's scratch and socket dirs, its log, and info(recipe) => the server's
    # entry in the report. The load tool is blackbuck-load whatever the run's: it alone spreads
    # requests over many pages (--target).
    def initialize(step:, scratch:, sockdir:, log:, info:, driver: Drivers.build("blackbuck-load"))
      @step = step
      @driver = driver
      @scratch = scratch
      @sockdir = sockdir
      @log = log
      @info = info
      @sockets = 0
    end

    # The app's production environment (bench-env.json, written by the generator) for every server.
    # Blackbuck in the app's bundle; the peers outside it, with the Rails gem directory on GEM_PATH
    # (see Servers::MEMORY_BASE).
    def self.env(recipe, app_dir = Servers.memory_app_dir)
      extra = JSON.parse(File.read(File.join(app_dir, MemoryRailsApp::ENV_FILE))).merge(recipe.env)
      unless recipe.bundled?
        env = Machine.server_env(bundled: false, extra: extra)
        rails_gems = MemoryRailsApp.abi_gem_dir(ServerRuby.current)
        env["GEM_PATH"] = [Servers.gem_home, rails_gems, *ServerRuby.current.default_gem_path].uniq.join(":")
        return env
      end
      Machine.server_env(bundled: true, gemfile: File.join(app_dir, "Gemfile"), extra: extra)
    end

    TOOL_MAX_TARGETS = 64 # blackbuck-load's MAX_TARGETS (loadgen/src): the 90 pages go in even groups

    # [[target, ...], ...]: every page once, in groups the load tool takes
    def self.target_groups(paths = MemoryRailsApp.endpoints)
      size = (paths.size.to_f / (paths.size.to_f / TOOL_MAX_TARGETS).ceil).ceil
      paths.map { |path| { "name" => path, "path" => path, "weight" => 1 } }.each_slice(size).to_a
    end

    # One load over every page: the groups back to back, seconds split evenly between them. One
    # Result: requests and seconds added up (req/s = all requests / all seconds), the larger p50
    # and p99 of the groups, errors added up.
    def run_load(server, seconds, dir)
      groups = MemoryStep.target_groups
      results = groups.each_with_index.map do |group, i|
        @driver.run(target(server), load(seconds.to_f / groups.size, group), keepalive: true,
                    scratch: scratch_dir(dir, "#{File.basename(dir)}-#{i}"))
      end
      MemoryStep.combine(results)
    end

    def self.combine(results)
      requests = results.sum { |r| r.requests.to_i }
      seconds = results.sum { |r| r.seconds.to_f }
      detail = results.each_with_object(Hash.new(0)) { |r, h| (r.error_detail || {}).each { |k, v| h[k] += v } }
      Result.new(requests: requests, seconds: seconds, rps: seconds.positive? ? requests / seconds : 0.0,
                 p50_ms: results.map(&:p50_ms).compact.max, p99_ms: results.map(&:p99_ms).compact.max,
                 errors: results.sum { |r| r.errors.to_i }, error_detail: detail,
                 command: results.map(&:command).join(" ; "),
                 tool_cpu_us_per_req: results.map(&:tool_cpu_us_per_req).compact.max)
    end

    # => [Measurement] one per server
    def run
      app_missing = app_absent_reason
      @step.servers.map do |name|
        m = Measurement.new(server: name, app: @step.workload.name, transport: "unix", mode: "keepalive", rep: 0)
        recipe = Servers.fetch(name)
        info = @info.call(recipe)
        if (why = app_missing || recipe.absent_reason)
          @log.call("#{name}/memory: absent (#{why})")
          next m.absent!(info, why)
        end
        measure(recipe, info, m)
      end
    end

    private

    # nil once the app is there: generated now for the run's Ruby if it is not (or its generator
    # changed), which takes about 20 s (Rails 8.1: about a minute); else why the rows are absent.
    def app_absent_reason
      dir = Servers.memory_app_dir
      return nil if MemoryRailsApp.ready?(dir)

      ruby = ServerRuby.current
      @log.call("memory: generating the Rails #{MemoryRailsApp.rails_for(ruby.full_version).version} app for Ruby " \
                "#{ruby.full_version} in #{dir} (bench/apps/memory_rails/generate.rb)")
      MemoryRailsApp.generate(dir, ruby)
      nil
    rescue StandardError => e
      "the Rails app #{dir} could not be generated: #{e.message.tr("\n", ' ')}"
    end

    def measure(recipe, info, m)
      dir = File.join(@scratch, "#{recipe.name}-memory")
      FileUtils.mkdir_p(dir)
      ctx = LaunchContext.new(app_name: @step.workload.app, app_path: @step.workload.app_path, workers: @step.workers,
                              tcp_port: free_port, unix_path: File.join(@sockdir, "m#{@sockets += 1}.sock"),
                              dir: dir, root: Servers::ROOT)
      t0 = monotonic
      server = ServerProcess.new(recipe, ctx, MemoryStep.env(recipe), boot_timeout: BOOT_TIMEOUT_S)
      server.spawn
      server.wait_ready
      info["command"] ||= server.command_line
      @log.call("#{recipe.name}/memory: up in #{(monotonic - t0).round(1)}s (pid #{server.pid})")
      warm = warm_up(server, dir)
      warm["refork"] = wait_for_refork(server, recipe) if recipe.reforked_re
      m.result = run_load(server, @step.duration, File.join(dir, "load"))
      procs, warm["top_ups"], warm["youngest_worker_served_s"] = sample_served(server, recipe, dir)
      raise "#{recipe.name} exited: #{server.log_tail(4)}" unless server.alive?

      smaps = Memory.summarize(procs)
      m.memory = { rss_kb_per_worker: smaps["rss_kb_per_worker"], pss_kb_per_worker: smaps["pss_kb_per_worker"],
                   workers_seen: smaps["workers_seen"], smaps: smaps, warm: warm,
                   ruby_opts: recipe.env["RUBYOPT"], ld_preload: recipe.env["LD_PRELOAD"] }
      m.status = "ok"
      @log.call(format("%-30s memory: USS/worker %s KB, PSS/worker %s KB, shared %s%%, total PSS %s KB, %d req/s, warm-up %d requests",
                       recipe.name, smaps["uss_kb_per_worker"], smaps["pss_kb_per_worker"], smaps["shared_pct_per_worker"],
                       smaps["total_pss_kb"], m.result.rps, warm["requests"]))
      m
    rescue ServerProcess::BootError, Driver::Failed, Driver::Unsupported, StandardError => e
      # StandardError too: one server's trouble must not end the run
      m.status = "failed"
      m.reason = e.is_a?(ServerProcess::BootError) ? "boot: #{e.message}" : "#{e.class}: #{e.message}"
      info["failures"]["memory"] = m.reason
      @log.call("#{recipe.name}/memory: FAILED: #{m.reason}")
      m
    ensure
      server&.stop
    end

    # => [procs, top-up loads run, the youngest worker's time under load since its fork]. Called
    # right after a load.
    def sample_served(server, recipe, dir)
      load_end = monotonic
      top_ups = 0
      loop do
        procs = Memory.sample(server.pid, recipe.worker_re)
        youngest = Memory.youngest_worker_age_s(procs)
        served = youngest && (youngest - (monotonic - load_end)).round(1)
        complete = procs.count { |p| p.role == "worker" } >= @step.workers
        return [procs, top_ups, served] if top_ups >= MAX_TOP_UPS || (complete && (served.nil? || served >= MIN_SERVED_S))

        run_load(server, TOP_UP_S, File.join(dir, "top-up-#{top_ups += 1}"))
        load_end = monotonic
      end
    end

    # Chunks of WARM_CHUNK_S until WARM_REQUESTS are done: the load tool runs for a time, not a count.
    def warm_up(server, dir)
      done = errors = chunks = 0
      t0 = monotonic
      while done < WARM_REQUESTS && monotonic - t0 < WARM_MAX_S
        r = run_load(server, WARM_CHUNK_S, File.join(dir, "warm-#{chunks}"))
        done += r.requests.to_i
        errors += r.errors.to_i
        chunks += 1
      end
      { "requests" => done, "errors" => errors, "seconds" => (monotonic - t0).round(1) }
    end

    # Puma's fork_worker re-forks workers 1..N-1 from worker 0 once worker 0 has served 1000
    # requests. If the warm-up did not get it there, SIGURG asks for the refork now.
    def wait_for_refork(server, recipe)
      want = @step.workers - 1
      count = -> { File.read(server.log_path).scan(recipe.reforked_re).size }
      trigger = "auto"
      deadline = monotonic + 5
      sleep 0.2 while count.call < want && monotonic < deadline
      if count.call < want
        trigger = "SIGURG"
        Process.kill("URG", server.pid)
        deadline = monotonic + REFORK_WAIT_S
        sleep 0.2 while count.call < want && monotonic < deadline
      end
      raise "no refork: #{count.call}/#{want} workers re-forked (#{trigger})" if count.call < want

      trigger
    end

    def load(seconds, targets)
      { threads: 1, connections: @step.connections, duration: seconds, timeout: 10, targets: targets, spread: true }
    end

    def target(server) = { transport: "unix", tcp_port: server.ctx.tcp_port, unix_path: server.ctx.unix_path }

    def scratch_dir(dir, name) = File.join(dir, name).tap { |d| FileUtils.mkdir_p(d) }

  end
end
