# frozen_string_literal: true

require "fileutils"
require "io/wait"
require "json"
require "rbconfig"
require_relative "servers"
require_relative "server_process"
require_relative "drivers"
require_relative "machine"
require_relative "memory"
require_relative "stats"
require_relative "local"

module BlackbuckBench
  # The streams workload's arithmetic (issue 35): one row's derived figures and the issue's targets
  # as ratios between rows of one run. Pure functions over hashes, tested in bench/test.
  module Streams
    # Blackbuck's row and the row it is held against, by the name the run gave them: with YJIT (on
    # 3.4 and 4.0 the rows run as their +yjit twins) or without, the same on both sides.
    SERVER = "blackbuck-streams"
    PEER = "falcon"
    FAST_P99_LIMIT = 2.0 # fast p99 with streams at most twice its value without

    module_function

    # The row's own figures: fast p99 with streams over without, and what one stream costs in
    # memory: (total PSS of the tree at the peak - before the streams) / streams requested.
    # fast_with: the fast load's Result beside the streams; fast_alone: the same load without. A
    # fast load that completed no request beside the streams (every worker held by a stream) has
    # no p99 and no ratio: fast_requests 0 says so, and the target fails.
    def derive(summary:, fast_with:, fast_alone:, before:, peak:, ending:)
      with_p99 = fast_with&.requests.to_i.positive? ? fast_with.p99_ms : nil
      alone_p99 = fast_alone&.p99_ms
      delta = peak && before && peak["total_pss_kb"] - before["total_pss_kb"]
      {
        "completed" => summary["completed"], "requested" => summary["requested"],
        "fast_requests" => fast_with&.requests.to_i,
        "fast_alone" => fast_alone && { "rps" => fast_alone.rps.round(1), "p50_ms" => fast_alone.p50_ms,
                                        "p99_ms" => alone_p99, "errors" => fast_alone.errors.to_i },
        "fast_p99_ratio" => with_p99 && alone_p99&.positive? ? (with_p99 / alone_p99).round(2) : nil,
        "pss_delta_kb" => delta,
        "pss_kb_per_stream" => delta && summary["requested"].to_i.positive? ? (delta.to_f / summary["requested"]).round(1) : nil,
        "memory_before" => before&.except("processes"), "memory_peak" => peak&.except("processes"),
        "memory_end" => ending
      }
    end

    # rows: { server name => the row's "streams" hash }. => one hash per target, for the pair
    # measured with the same YJIT setting (with it first); "pass" nil when a figure is missing.
    def evaluate(rows)
      suffix = ["+yjit", ""].find { |s| rows.key?("#{SERVER}#{s}") && rows.key?("#{PEER}#{s}") } ||
               ["+yjit", ""].find { |s| rows.key?("#{SERVER}#{s}") } || ""
      mine = rows["#{SERVER}#{suffix}"] || {}
      theirs = rows["#{PEER}#{suffix}"] || {}
      server = "#{SERVER}#{suffix}"
      peer = "#{PEER}#{suffix}"
      [
        target("all streams complete", server, nil, mine["completed"], mine["requested"], :equal),
        fast_target(server, mine),
        ratio("PSS per stream / #{peer}'s", server, peer, mine["pss_kb_per_stream"], theirs["pss_kb_per_stream"]),
        ratio("time to first event p99 / #{peer}'s", server, peer, mine.dig("clients", "ttfe_p99_ms"),
              theirs.dig("clients", "ttfe_p99_ms"))
      ]
    end

    def fast_target(server, mine)
      label = "fast p99 with streams / without"
      if mine["fast_requests"]&.zero?
        return { "label" => label, "server" => server, "peer" => nil, "value" => nil, "limit" => FAST_P99_LIMIT,
                 "pass" => false, "note" => "no fast request completed beside the streams" }
      end

      target(label, server, nil, mine["fast_p99_ratio"], FAST_P99_LIMIT, :at_most)
    end

    def target(label, server, peer, value, limit, how)
      pass = if value.nil? || limit.nil? then nil
             elsif how == :equal then value == limit
             else value <= limit
             end
      { "label" => label, "server" => server, "peer" => peer, "value" => value, "limit" => limit, "pass" => pass,
        "missing" => value.nil? ? "#{server}: no figure" : nil }
    end

    # mine / theirs <= 1; a peer figure of 0 or below (a stream that cost Falcon no memory it
    # could measure) leaves the ratio undefined
    def ratio(label, server, peer, mine, theirs)
      if mine.nil? || theirs.nil? || !theirs.positive?
        missing = [mine.nil? ? server : nil, theirs.nil? ? peer : nil].compact.join(" and ")
        missing = "#{peer}'s figure is #{theirs}" if missing.empty?
        return { "label" => label, "server" => server, "peer" => peer, "value" => nil, "limit" => 1.0, "pass" => nil,
                 "missing" => missing }
      end
      r = (mine.to_f / theirs).round(3)
      { "label" => label, "server" => server, "peer" => peer, "value" => r, "limit" => 1.0, "pass" => r <= 1.0,
        "mine" => mine, "theirs" => theirs }
    end
  end

  # The streams workload's procedure, one server at a time (1,000 open streams each): boot, a
  # warm-up of the fast endpoint, the fast load with no streams (the "without"), smaps of the tree,
  # then the stream client (SseClient, a process of its own) and, from the end of its ramp, the
  # same fast load beside it; smaps at the fast load's end (the peak: every stream opened, none
  # ended yet where a server holds them all) and when the client has finished (the end); stop.
  # Measured once per row, like the memory workload: a row lasts up to the client's bound.
  class StreamsStep
    include Local

    CLIENT = File.expand_path("sse_client.rb", __dir__)
    CLIENT_START_S = 15 # the client's Ruby boot, until its "ramp" line
    CLIENT_GRACE_S = 10 # beyond its bound before the client is killed

    # collaborators as MemoryStep's; stats_root: where the apps' per-worker facts go (tmpfs)
    def initialize(step:, scratch:, sockdir:, stats_root:, warmup_s:, log:, info:, driver: Drivers.build("blackbuck-load"))
      @step = step
      @shape = step.shape || step.workload.streams
      @scratch = scratch
      @sockdir = sockdir
      @stats_root = stats_root
      @warmup_s = warmup_s
      @log = log
      @info = info
      @driver = driver
      @sockets = 0
    end

    # => [Measurement] one per server
    def run
      @step.servers.map do |name|
        m = Measurement.new(server: name, app: @step.workload.name, transport: "tcp", mode: "keepalive", rep: 0)
        recipe = Servers.fetch(name)
        info = @info.call(recipe)
        if (why = recipe.absent_reason)
          @log.call("#{name}/streams: absent (#{why})")
          next m.absent!(info, why)
        end
        measure(recipe, info, m)
      end
    end

    private

    def measure(recipe, info, m)
      w = @step.workload
      dir = File.join(@scratch, "#{recipe.name}-streams")
      stats = File.join(@stats_root, "#{recipe.name}-streams")
      FileUtils.mkdir_p([dir, stats])
      ctx = LaunchContext.new(app_name: w.app, app_path: w.app_path, workers: @step.workers, tcp_port: free_port,
                              unix_path: File.join(@sockdir, "s#{@sockets += 1}.sock"), dir: dir, root: Servers::ROOT)
      t0 = monotonic
      env = Machine.server_env(bundled: recipe.bundled?, extra: recipe.env.merge("BENCH_STATS_DIR" => stats))
      server = ServerProcess.new(recipe, ctx, env)
      server.spawn
      server.wait_ready
      info["command"] ||= server.command_line
      info["probe"][w.name] = server.probe.transform_values { |p| p.transform_keys(&:to_s) }
      @log.call("#{recipe.name}/streams: up in #{(monotonic - t0).round(1)}s (pid #{server.pid})")
      fast(server, @warmup_s, File.join(dir, "warmup")) if @warmup_s.positive?
      alone = fast(server, @step.duration, File.join(dir, "fast-alone"))
      before = Memory.summarize(Memory.sample(server.pid, recipe.worker_re))
      with, peak, clients = beside_streams(server, recipe, dir)
      ending = Memory.summarize(Memory.sample(server.pid, recipe.worker_re))
      raise "#{recipe.name} exited: #{server.log_tail(4)}" unless server.alive?

      runtime = Stats.facts(stats)
      info["runtime"][w.name] = runtime unless runtime.empty?
      m.result = with
      m.memory = { rss_kb_per_worker: ending["rss_kb_per_worker"], pss_kb_per_worker: ending["pss_kb_per_worker"],
                   workers_seen: ending["workers_seen"] }
      m.streams = Streams.derive(summary: clients["summary"], fast_with: with, fast_alone: alone, before: before,
                                 peak: peak, ending: ending)
                         .merge("clients" => clients["summary"], "client_cpu_s" => clients["client_cpu_s"],
                                "client_seconds" => clients["seconds"], "shape" => @shape.to_h.transform_keys(&:to_s))
      m.status = "ok"
      s = m.streams
      @log.call(format("%-24s streams: %d/%d complete, first event p99 %s ms, fast p99 %s ms (alone %s), %d req/s, " \
                       "PSS/stream %s KB, end total PSS %s KB", recipe.name, s["completed"], s["requested"],
                       s.dig("clients", "ttfe_p99_ms").inspect, with.p99_ms.inspect, alone.p99_ms.inspect, with.rps,
                       s["pss_kb_per_stream"].inspect, ending["total_pss_kb"]))
      m
    rescue ServerProcess::BootError, Driver::Failed, Driver::Unsupported, StandardError => e
      # StandardError too: one server's trouble must not end the run
      m.status = "failed"
      m.reason = e.is_a?(ServerProcess::BootError) ? "boot: #{e.message}" : "#{e.class}: #{e.message}"
      info["failures"][w.name] = m.reason
      @log.call("#{recipe.name}/streams: FAILED: #{m.reason}")
      m
    ensure
      server&.stop
    end

    # The stream client, and from its ramp's end the fast load. => [fast Result, smaps summary at
    # the fast load's end, the client's JSON]
    def beside_streams(server, recipe, dir)
      out = File.join(dir, "sse.json")
      argv = [RbConfig.ruby, CLIENT, "--port", server.ctx.tcp_port.to_s, "--streams", @shape.streams.to_s,
              "--events", @shape.events.to_s, "--interval-ms", @shape.interval_ms.to_s, "--ramp", @shape.ramp_s.to_s,
              "--bound", @shape.bound_s.to_s, "--out", out]
      File.write(File.join(dir, "sse-command.txt"), "#{argv.join(' ')}\n")
      reader, writer = IO.pipe
      pid = Process.spawn(*argv, in: File::NULL, out: writer, err: [File.join(dir, "sse.err"), "w"], pgroup: true)
      writer.close
      raise "the stream client did not start within #{CLIENT_START_S} s" unless reader.wait_readable(CLIENT_START_S) && reader.gets

      sleep @shape.ramp_s
      with = fast(server, @step.duration, File.join(dir, "fast-with-streams"))
      peak = Memory.summarize(Memory.sample(server.pid, recipe.worker_re))
      wait_client(pid, @shape.bound_s + CLIENT_GRACE_S) # reaps it, or kills and reaps it and raises
      pid = nil
      raise "the stream client wrote no result: #{File.read(File.join(dir, 'sse.err'))[-300..]}" unless File.exist?(out)

      [with, peak.except("processes"), JSON.parse(File.read(out))]
    ensure
      reader&.close
      kill_group(pid) if pid # interrupted or failed: the client goes too
    end

    def wait_client(pid, seconds)
      deadline = monotonic + seconds
      loop do
        _, status = Process.waitpid2(pid, Process::WNOHANG)
        return status if status

        if monotonic > deadline
          kill_group(pid)
          raise "the stream client overran #{seconds.round} s and was killed"
        end
        sleep 0.05
      end
    end

    # The client's process group (ours: spawned with pgroup: true), then the client reaped.
    def kill_group(pid)
      Process.kill("KILL", -pid)
      Process.waitpid(pid)
    rescue SystemCallError
      nil
    end

    # 20 keep-alive clients on / over TCP, as fast as they go
    def fast(server, seconds, scratch)
      FileUtils.mkdir_p(scratch)
      @driver.run({ transport: "tcp", tcp_port: server.ctx.tcp_port, unix_path: server.ctx.unix_path },
                  { threads: 1, connections: @step.connections, duration: seconds, timeout: 5 }, keepalive: true,
                  scratch: scratch)
    end
  end
end
