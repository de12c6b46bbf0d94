# frozen_string_literal: true

require "json"
require "shellwords"

module BlackbuckBench
  # Load tools. Each builds a command for one cell, runs it bounded in time (killed by pid if it
  # overruns), and parses its output into one Result. Requests/s is always requests completed /
  # the tool's own measured duration.
  # classes: per-target results of a mixed load, { path => { "requests", "rps", "p50_ms", "p99_ms",
  # "max_ms", "errors", "connections" } } (blackbuck-load --target only).
  Result = Struct.new(:requests, :seconds, :rps, :p50_ms, :p99_ms, :errors, :error_detail,
                      :command, :tool_cpu_us_per_req, :classes, keyword_init: true)

  class Driver
    class Unsupported < StandardError; end
    class Failed < StandardError; end

    OVERRUN_S = 20 # grace beyond --duration before the tool is killed

    attr_reader :name

    def initialize(name, path)
      @name = name
      @path = path
    end

    def available? = !@path.nil? && File.executable?(@path)

    def absent_reason = available? ? nil : "#{name} not found"

    # target: { transport: "tcp"|"unix", tcp_port:, unix_path: }; load: { threads:, connections:,
    # duration:, timeout: }; keepalive: true|false
    # expected_rps: a recent rate for this server, for tools that need a request count (h2load)
    # load[:targets]: [{ "path", "weight" }] for a per-class load (blackbuck-load only)
    def run(target, load, keepalive:, scratch:, expected_rps: nil)
      reason = unsupported(target[:transport], keepalive) ||
               (load[:targets] && !targets? ? "#{name} cannot pin connections to targets (per-class latency)" : nil)
      raise Unsupported, reason if reason
      raise Failed, absent_reason unless available?

      @expected_rps = expected_rps
      argv = command(target, load, keepalive, scratch)
      out_path = File.join(scratch, "#{name}.out")
      cpu0 = children_cpu_s
      pid = Process.spawn(*argv, in: File::NULL, %i[out err] => [out_path, "w"], pgroup: true)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + load[:duration] + OVERRUN_S
      status = nil
      begin
        loop do
          _, status = Process.waitpid2(pid, Process::WNOHANG)
          break if status
          raise Failed, "#{name} overran #{load[:duration] + OVERRUN_S}s and was killed" if
            Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          sleep 0.05
        end
      ensure
        unless status # overran, or the harness was interrupted: the tool goes too
          Process.kill("KILL", -pid)
          Process.waitpid(pid)
        end
      end
      output = File.read(out_path)
      result = parse(output, scratch)
      raise Failed, "#{name} exited #{status.exitstatus}: #{output.lines.last(3).join.strip}" if result.nil?

      result.command = Shellwords.join(argv)
      # the tool's own CPU (all its threads), from the rusage of the reaped child: the same
      # measure for every tool, so the cross-check can say which tool leaves more CPU to the server
      result.tool_cpu_us_per_req = ((children_cpu_s - cpu0) * 1e6 / result.requests).round(2) if result.requests.to_i.positive?
      result
    end

    def unsupported(_transport, _keepalive) = nil

    # Can it load several targets and report each one's latency? (blackbuck-load --target)
    def targets? = false

    private

    def children_cpu_s = Process.times.then { |t| t.cutime + t.cstime }

    def time_arg(seconds) = (seconds % 1).zero? ? "#{seconds.to_i}s" : "#{(seconds * 1000).round}ms"

    def ms(value, unit)
      v = value.to_f
      case unit
      when "us" then v / 1000.0
      when "ms" then v
      when "s" then v * 1000.0
      when "m" then v * 60_000.0
      else v
      end
    end

    def url(target) = target[:transport] == "tcp" ? "http://127.0.0.1:#{target[:tcp_port]}/" : "http://localhost/"

    # wrk's text output (also blackbuck-load's, which is wrk-compatible).
    def parse_wrk_text(text)
      rps = text[%r{^Requests/sec:\s+([\d.]+)}, 1] or return nil
      m = text.match(/(\d+) requests in ([\d.]+)(us|ms|s|m)/)
      lat = ->(pct) { (x = text.match(/^\s+#{pct}%\s+([\d.]+)(us|ms|s|m)/)) && ms(x[1], x[2]) }
      detail = {}
      if (se = text.match(/Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/))
        detail.update("connect" => se[1].to_i, "read" => se[2].to_i, "write" => se[3].to_i, "timeout" => se[4].to_i)
      end
      non2xx = text[/Non-2xx or 3xx responses: (\d+)/, 1].to_i
      detail["non_2xx_3xx"] = non2xx if non2xx.positive?
      Result.new(requests: m && m[1].to_i, seconds: m && ms(m[2], m[3]) / 1000.0, rps: rps.to_f,
                 p50_ms: lat.call(50), p99_ms: lat.call(99), errors: detail.values.sum, error_detail: detail)
    end
  end

  # The project's load generator (loadgen/). wrk's CLI plus --unix-socket, --no-keepalive, --json.
  class BlackbuckLoad < Driver
    SEED = 1 # --seed: the same assignment of connections to targets in every run

    def targets? = true

    def command(target, load, keepalive, scratch)
      argv = [@path, "-t", load[:threads].to_s, "-c", load[:connections].to_s, "-d", time_arg(load[:duration]),
              "--timeout", time_arg(load[:timeout]), "--latency", "--json", File.join(scratch, "load.json")]
      argv += ["--unix-socket", target[:unix_path]] if target[:transport] == "unix"
      argv << "--no-keepalive" unless keepalive
      if load[:targets]
        # each connection pinned to one target, so the weights are connection counts; or, with
        # load[:spread], each request picks its target by weight (the memory workload's 90 pages)
        load[:targets].each { |t| argv += ["--target", "GET #{t['path']}", t["weight"].to_s] }
        argv << "--target-per-connection" unless load[:spread]
        argv += ["--seed", SEED.to_s]
      end
      argv << url(target)
    end

    def parse(text, scratch)
      json_path = File.join(scratch, "load.json")
      from_json = File.exist?(json_path) && parse_json(File.read(json_path))
      from_json || parse_wrk_text(text)
    end

    # The --json schema (version 1, loadgen/src/json.c): requests_per_sec, requests, runtime_s,
    # errors {connect read write timeout status connect_retry}, latency_us.percentiles {"50",
    # "99", ...} in microseconds.
    # Anything else => nil, and the wrk-style text output is parsed instead.
    COUNTED_ERRORS = %w[connect read write timeout status].freeze

    def parse_json(raw)
      j = JSON.parse(raw)
      return nil unless j["schema_version"] == 1 && j["requests_per_sec"].is_a?(Numeric)

      pct = j.dig("latency_us", "percentiles") || {}
      errs = (j["errors"] || {}).transform_values(&:to_i).select { |_, v| v.positive? }
      Result.new(requests: j["requests"].to_i, seconds: j["runtime_s"].to_f, rps: j["requests_per_sec"].to_f,
                 p50_ms: pct["50"] && pct["50"] / 1000.0, p99_ms: pct["99"] && pct["99"] / 1000.0,
                 errors: errs.slice(*COUNTED_ERRORS).values.sum, error_detail: errs,
                 classes: parse_targets(j["targets"], j["runtime_s"].to_f))
    rescue JSON::ParserError
      nil
    end

    # The "targets" array of --target runs: { "method", "path", "weight", "connections",
    # "requests", "errors" {connect read write timeout status connect_retry}, "non_2xx_3xx",
    # "latency_us" } => { path => class result }. latency_us has the run's own shape ("min",
    # "mean", "max", "percentiles" {"50", "99", ...}, in µs); flat "p50"/"p99" keys are read too.
    # errors.status is non_2xx_3xx again: counted once.
    TARGET_ERRORS = %w[connect read write timeout].freeze

    def parse_targets(targets, runtime_s)
      return nil unless targets.is_a?(Array) && targets.any?

      targets.to_h do |t|
        lat = t["latency_us"] || {}
        pct = lat["percentiles"] || {}
        ms = ->(k) { (v = lat[k] || pct[k.delete_prefix("p")]) && v / 1000.0 }
        errors = (t["errors"] || {}).slice(*TARGET_ERRORS).values.sum(&:to_i) + t["non_2xx_3xx"].to_i
        [t["path"], { "requests" => t["requests"].to_i, "connections" => t["connections"],
                      "rps" => runtime_s.positive? ? (t["requests"].to_i / runtime_s).round(1) : nil,
                      "p50_ms" => ms.call("p50"), "p99_ms" => ms.call("p99"), "max_ms" => ms.call("max"),
                      "errors" => errors }]
      end
    end
  end

  # h2load --h1: UNIX sockets via -B unix:PATH. Latency percentiles come from its per-request
  # --log-file (it prints none). Connection-per-request: it sends "Connection: close" and
  # reconnects after each response. Two limits of h2load 1.52 shape this class:
  # - with -D (duration) it hangs at the end whenever the server closes connections (Unicorn,
  #   Pitchfork, or any server in close mode), so it always runs a request count (-n) sized from
  #   the server's last measured rate to last about --duration; rps = done / its own elapsed time;
  # - it cannot end a body at EOF (no length, no chunking), so such responses never complete.
  class H2load < Driver
    DEFAULT_RPS = 5_000 # request-count estimate before anything was measured on this server

    def command(target, load, keepalive, scratch)
      n = [((@expected_rps || DEFAULT_RPS) * load[:duration]).round, load[:connections] * 10].max
      argv = [@path, "--h1", "-t", load[:threads].to_s, "-c", load[:connections].to_s,
              "-n", n.to_s, "-N", time_arg(load[:timeout]), "--log-file", File.join(scratch, "h2load.log")]
      argv += ["-H", "Connection: close"] unless keepalive
      argv += ["-B", "unix:#{target[:unix_path]}"] if target[:transport] == "unix"
      argv << url(target)
    end

    def parse(text, scratch)
      m = text.match(/finished in ([\d.]+)(us|ms|s),\s*([\d.]+) req\/s/) or return nil
      r = text.match(/requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout/)
      codes = text.match(/status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx/)
      detail = { "failed" => r[5].to_i, "errored" => r[6].to_i, "timeout" => r[7].to_i }
      detail["non_2xx_3xx"] = codes[3].to_i + codes[4].to_i if codes
      detail.reject! { |_, v| v.zero? }
      seconds = ms(m[1], m[2]) / 1000.0
      p50, p99 = percentiles(File.join(scratch, "h2load.log"))
      ok = r[4].to_i
      Result.new(requests: ok, seconds: seconds, rps: seconds.positive? ? ok / seconds : 0.0,
                 p50_ms: p50, p99_ms: p99, errors: detail.values.sum, error_detail: detail)
    end

    private

    # h2load --log-file: "<start µs since epoch>\t<status>\t<duration µs>" per request
    def percentiles(path)
      return [nil, nil] unless File.exist?(path)

      d = []
      File.foreach(path) { |l| v = l.split("\t")[2]; d << v.to_i if v }
      File.delete(path) # can be tens of MB
      return [nil, nil] if d.empty?

      d.sort!
      [d[(d.size * 0.50).floor.clamp(0, d.size - 1)] / 1000.0, d[(d.size * 0.99).floor.clamp(0, d.size - 1)] / 1000.0]
    end
  end

  # wrk: TCP only (no UNIX sockets). Connection-per-request via "Connection: close". It counts
  # a read error for every EOF-delimited response (Unicorn's seed hello) while still counting
  # the request, so such rows show errors == requests: a wrk artefact, noted in the report.
  class Wrk < Driver
    def unsupported(transport, _keepalive) = transport == "unix" ? "wrk has no UNIX socket support" : nil

    def command(target, load, keepalive, _scratch)
      argv = [@path, "-t", load[:threads].to_s, "-c", load[:connections].to_s, "-d", "#{load[:duration].ceil}s",
              "--timeout", "#{load[:timeout].ceil}s", "--latency"] # wrk takes whole seconds only
      argv += ["-H", "Connection: close"] unless keepalive
      argv << url(target)
    end

    def parse(text, _scratch) = parse_wrk_text(text)
  end

  module Drivers
    ROOT = File.expand_path("../../..", __dir__)
    LOADGEN = File.join(ROOT, "loadgen", "blackbuck-load")

    def self.which(name)
      ENV.fetch("PATH", "").split(":").map { |d| File.join(d, name) }.find { |p| File.executable?(p) }
    end

    def self.build(name)
      case name
      when "blackbuck-load" then BlackbuckLoad.new(name, File.executable?(LOADGEN) ? LOADGEN : nil)
      when "h2load" then H2load.new(name, which("h2load"))
      when "wrk" then Wrk.new(name, which("wrk"))
      else raise ArgumentError, "unknown driver #{name} (blackbuck-load, h2load, wrk, auto)"
      end
    end

    # auto: blackbuck-load once it is built, else h2load (the only other tool here that does
    # UNIX sockets).
    def self.resolve(name)
      return build(name) unless name == "auto"

      bl = build("blackbuck-load")
      bl.available? ? bl : build("h2load")
    end
  end
end
