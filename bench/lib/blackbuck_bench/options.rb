# frozen_string_literal: true

require "optparse"
require_relative "servers"
require_relative "workloads"
require_relative "server_ruby"

module BlackbuckBench
  TRANSPORTS = %w[tcp unix].freeze
  MODES = %w[keepalive close].freeze

  # All defaults in one hash; --quick overrides a few of them (the flags given on the command
  # line still win over --quick, and BENCH_ONLY / --only picks a named subset).
  DEFAULTS = {
    workers: 2,            # worker processes per server (nginx: worker_processes); mixed: its own
    threads: 1,            # load-tool threads: on 2 cores the tool gets one, the server the rest
    connections: 50,       # concurrent connections (mixed: its own)
    duration: 3,           # seconds per measurement (iowait, mixed: their own)
    warmup: 1,             # seconds of keep-alive load after each boot, not recorded
    timeout: 5,            # per-request timeout of the load tool, seconds
    repeat: 3,             # measurements per cell, interleaved across servers
    servers: Servers.default_names,
    workloads: DEFAULT_WORKLOADS,
    transports: TRANSPORTS,
    modes: MODES,
    only: nil,             # BENCH_ONLY subset name
    driver: "auto",        # blackbuck-load when built, else h2load
    crosscheck: true,      # one cell also measured with wrk (TCP) and h2load (UNIX)
    crosscheck_cell: %w[auto hello_length keepalive], # server workload mode; auto = blackbuck, else unicorn
    out: File.expand_path("../../results", __dir__),
    quick: false,
    plan: false,           # print the plan and its estimate, measure nothing
    cpu_hog: false,        # one busy process per core beside the whole run (a shared CPU)
    streams: nil,          # the streams workload's streams per server (nil: its own, 1,000); smoke runs use fewer
    stream_events: nil,    # ... and events per stream (nil: 30)
    ruby: ServerRuby::DEFAULT # the servers' Ruby (also BENCH_RUBY): 3.4, 4.0, 3.1 or a path (ServerRuby)
  }.freeze

  # CI: every server and every workload that has quick cells once, very short (not the memory
  # workload: a Rails boot and warm-up per row). Durations of workloads that set their own (iowait,
  # mixed) are capped at this one too.
  # Its servers run on the Ruby running the harness (CI's lanes each run bench:quick with their
  # own), unless --ruby or BENCH_RUBY names one.
  QUICK = { ruby: ServerRuby::CURRENT, duration: 1, warmup: 0, repeat: 1,
            workloads: WORKLOADS.reject { |w| w.quick_cells.empty? }.map(&:name) }.freeze

  def self.parse_options(argv, env: ENV)
    given = {}
    list = ->(key, allowed) { ->(v) { given[key] = check_list(key, v.split(","), allowed) } }
    workloads = WORKLOADS.map(&:name)
    OptionParser.new do |o|
      o.banner = "usage: ruby bench/run.rb [options]   (see bench/README.md)"
      o.on("--quick", "CI matrix: #{QUICK.map { |k, v| "#{k}=#{Array(v).join(',')}" }.join(' ')}, each workload's quick cells") { given[:quick] = true }
      o.on("--plan", "print the plan (servers x cells per workload) and its estimate, and exit: measures nothing") { given[:plan] = true }
      o.on("--ruby VERSION", "the servers' Ruby (also BENCH_RUBY): 3.4, 4.0, 3.1 (test/matrix.rb finds it) or a ruby path " \
                             "(#{DEFAULTS[:ruby]}; --quick: the Ruby running this)") { |v| given[:ruby] = v }
      o.on("--only NAME", "named subset (also BENCH_ONLY=NAME): #{SUBSETS.keys.join(', ')}") { |v| given[:only] = v }
      o.on("--workers N", Integer, "worker processes per server (#{DEFAULTS[:workers]}; mixed: #{MIXED_WORKERS})") { |v| given[:workers] = positive(:workers, v) }
      o.on("--duration S", Float, "seconds per measurement (#{DEFAULTS[:duration]}; iowait, mixed: #{MIXED_DURATION_S})") { |v| given[:duration] = positive(:duration, v) }
      o.on("--warmup S", Float, "warm-up seconds after boot (#{DEFAULTS[:warmup]})") { |v| given[:warmup] = v }
      o.on("--connections N", Integer, "connections (#{DEFAULTS[:connections]}; mixed: its targets' weights)") { |v| given[:connections] = positive(:connections, v) }
      o.on("--threads N", Integer, "load-tool threads (#{DEFAULTS[:threads]})") { |v| given[:threads] = positive(:threads, v) }
      o.on("--timeout S", Integer, "load-tool request timeout (#{DEFAULTS[:timeout]})") { |v| given[:timeout] = positive(:timeout, v) }
      o.on("--repeat N", Integer, "measurements per cell (#{DEFAULTS[:repeat]})") { |v| given[:repeat] = positive(:repeat, v) }
      o.on("--servers LIST", Servers.names.join(","), &list.call(:servers, Servers.names))
      o.on("--workloads LIST", "--apps LIST", workloads.join(","), &list.call(:workloads, workloads))
      o.on("--transports LIST", TRANSPORTS.join(","), &list.call(:transports, TRANSPORTS))
      o.on("--modes LIST", MODES.join(","), &list.call(:modes, MODES))
      o.on("--driver NAME", "auto, blackbuck-load, h2load, wrk (#{DEFAULTS[:driver]})") { |v| given[:driver] = v }
      o.on("--streams N", Integer, "streams workload: streams per server (#{STREAMS_SHAPE.streams}; fewer for a smoke run)") { |v| given[:streams] = positive(:streams, v) }
      o.on("--stream-events N", Integer, "streams workload: events per stream (#{STREAMS_SHAPE.events})") { |v| given[:stream_events] = positive(:stream_events, v) }
      o.on("--[no-]crosscheck", "also measure one cell with wrk and h2load") { |v| given[:crosscheck] = v }
      o.on("--crosscheck-cell SERVER,WORKLOAD,MODE", "default #{DEFAULTS[:crosscheck_cell].join(',')}") do |v|
        given[:crosscheck_cell] = v.split(",")
      end
      o.on("--out DIR", "where latest.{json,md,png} go") { |v| given[:out] = File.expand_path(v) }
      o.on("--[no-]cpu-hog", "run beside one busy process per core (`yes > /dev/null`): the CPU shared " \
                             "with nginx, sidecars or jobs, as in production") { |v| given[:cpu_hog] = v }
    end.parse!(argv)
    given[:only] ||= env["BENCH_ONLY"] unless env["BENCH_ONLY"].to_s.empty?
    given[:ruby] ||= env["BENCH_RUBY"] unless env["BENCH_RUBY"].to_s.empty?
    base = DEFAULTS.dup
    base.update(QUICK) if given[:quick]
    base.update(subset(given[:only])) if given[:only]
    base[:servers_given] = given.key?(:servers)
    base.update(given)
  end

  def self.subset(name)
    s = SUBSETS[name] or raise OptionParser::InvalidArgument, "BENCH_ONLY/--only: unknown #{name} (known: #{SUBSETS.keys.join(', ')})"
    out = s.slice(:workloads, :transports, :modes)
    out[:servers] = Servers.names.select { |n| Servers.fetch(n).ruby? && !Servers.fetch(n).variant? } if s[:servers] == :ruby_with_twins
    out
  end

  def self.check_list(key, values, allowed)
    bad = values - allowed
    raise OptionParser::InvalidArgument, "--#{key}: unknown #{bad.join(',')} (known: #{allowed.join(',')})" unless bad.empty?

    values
  end

  def self.positive(key, value)
    raise OptionParser::InvalidArgument, "--#{key} must be > 0" unless value.positive?

    value
  end
end
