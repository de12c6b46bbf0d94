# frozen_string_literal: true

module BlackbuckBench
  # What is measured: an app, the cells (transport x connection mode) it is measured in, and the
  # load shape. Every server of the run serves every workload it applies to; bench/README.md
  # gives each workload's method. Nil fields take the run's flags (--workers, --connections,
  # --duration).
  #
  # cells        [[transport, mode], ...] in the full run; quick_cells in --quick
  # targets      per-class load (blackbuck-load --target): [{ "name", "path", "weight" }]; the
  #              connections are pinned to a class (--target-per-connection), so the weights
  #              are connection counts
  # front        "nginx": the client talks to nginx, which proxies to the server's UNIX socket
  # ceiling      nginx `return 200` runs it too (the apps whose bytes nginx can serve alone)
  # yjit         the +yjit twins run it; quick_yjit: in --quick too (their first quick cell only)
  # quick_servers  in --quick, only these servers (nil: all): workloads whose code path does not
  #              depend on the server (the seed hello, the front, the 64 KiB body) need not boot
  #              every server in CI
  # rails        the app is bench/apps/rails.ru: its Rails and Rack are the run's Ruby's
  #              (RailsStack: Debian's Rails 6.1 on Rack 2.2 on 3.1, Rails 8.1 on Rack 3.1 elsewhere),
  #              peers get the Rack pin first (RUBYOPT=-r), blackbuck runs under that Rails' gemfile
  # without_yjit on a Ruby with YJIT by default, the rows without YJIT run it too (the comparison);
  #              quick_yjit: in --quick too (their first quick cell only)
  # driver       the load tool for this workload (nil: the run's --driver); the warm-up always
  #              uses the run's driver, so that h2load can size its request count from its rate
  # threaded     the threaded recipes (Recipe#threaded?: Blackbuck with app threads, Puma 8 with 2
  #              threads) that run it too, on the apps that wait; in --quick only those of
  #              quick_servers
  # rows         only these servers run it (nil: all; the names of the rows, not their twins)
  # streams      the streams workload's shape (StreamShape): streams per server, events, interval,
  #              ramp, bound; its procedure is StreamsStep (streams.rb), one server at a time
  Workload = Struct.new(:name, :app, :title, :cells, :quick_cells, :workers, :connections, :duration,
                        :targets, :front, :ceiling, :yjit, :quick_yjit, :quick_servers, :rails, :without_yjit,
                        :driver, :threaded, :memory, :rows, :streams, keyword_init: true) do
    def mixed? = !targets.nil? && !memory

    def memory? = memory == true

    def streams? = !streams.nil?

    # blackbuck-load's --target arguments and --json "targets" are keyed by path
    def class_name(path) = targets&.find { |t| t["path"] == path }&.dig("name") || path

    # the memory workload's app is generated for the run's Ruby (MemoryStep), outside bench/apps
    def app_path = memory? ? File.join(Servers.memory_app_dir, "config.ru") : File.expand_path("../../apps/#{app}.ru", __dir__)
  end

  ALL_CELLS = [%w[tcp keepalive], %w[tcp close], %w[unix keepalive], %w[unix close]].freeze
  UNIX_KA = [%w[unix keepalive]].freeze
  MIXED_TARGETS = [{ "name" => "fast", "path" => "/fast", "weight" => 16 },
                   { "name" => "slow", "path" => "/slow", "weight" => 2 }].freeze
  MIXED_WORKERS = 4 # the mixed workload's own worker count (as measured by hand in issue 11)
  MIXED_DURATION_S = 5 # long enough for each slow connection to make ~16 requests

  # The memory workload (issue 24): one server at a time on a generated Rails app (Rails 8.1 on
  # Ruby >= 3.2, 7.2 on 3.1; 15 scaffolds, 90 pages), warmed with MemoryStep::WARM_REQUESTS requests over every page, then
  # each process's smaps_rollup and a short req/s load. Its rows are its own recipes
  # (Servers::MEMORY: reforking, warmup, jemalloc, YJIT code-region variants). Not in --quick: a
  # Rails boot and warm-up per row take ~30 s.
  MEMORY_WORKLOAD = Workload.new(name: "memory", app: "memory_rails", cells: UNIX_KA, quick_cells: [], workers: 4,
                                 connections: 8, duration: 5, memory: true,
                                 title: "memory after warm-up: Rails app (8.1 on Ruby >= 3.2, 7.2 on 3.1), 15 scaffolds, 90 pages, 4 workers")

  # The streams workload (issue 35, "Tests and numbers"): per server, 1,000 concurrent SSE streams
  # of 30 events 100 ms apart (bench/apps/streams.ru /sse, read by SseClient), and beside them 20
  # keep-alive clients on the fast endpoint (/, blackbuck-load as fast as they go), against the same
  # 20 clients with no streams. One server at a time (1,000 streams each); no quick cells: a row
  # lasts up to ~30 s and CI's bench:quick must not change.
  # ramp_s: the streams are opened evenly over it (one a millisecond); bound_s: the stream client
  # closes what is still open then (ramp + 3 s of events + STREAM_SLACK_S for late streams). The fast load
  # runs from the ramp's end for the workload's duration (events x interval - ramp = 2 s: while
  # every stream of a server that holds them all is open).
  STREAM_SLACK_S = 15
  StreamShape = Struct.new(:streams, :events, :interval_ms, :ramp_s, keyword_init: true) do
    def stream_s = events * interval_ms / 1000.0

    def bound_s = ramp_s + stream_s + STREAM_SLACK_S
  end
  STREAMS_SHAPE = StreamShape.new(streams: 1000, events: 30, interval_ms: 100, ramp_s: 1.0).freeze
  STREAMS_FAST_CONNECTIONS = 20
  STREAMS_FAST_S = STREAMS_SHAPE.stream_s - STREAMS_SHAPE.ramp_s
  # Blackbuck with and without --streams, and the peers issue 35 names: Falcon (a fiber per
  # request), Puma 8 with 5 threads and with 32 on M:N threads, Unicorn, Pitchfork, Iodine
  STREAMS_ROWS = %w[blackbuck blackbuck-streams blackbuck-streams-2x5 falcon puma8-2x5 puma8-2x32-mn unicorn pitchfork iodine-2x1].freeze
  STREAMS_WORKLOAD = Workload.new(name: "streams", app: "streams", cells: [%w[tcp keepalive]], quick_cells: [], workers: 2,
                                  connections: STREAMS_FAST_CONNECTIONS, duration: STREAMS_FAST_S, rows: STREAMS_ROWS,
                                  streams: STREAMS_SHAPE,
                                  title: "#{STREAMS_SHAPE.streams} SSE streams of #{STREAMS_SHAPE.events} events " \
                                         "#{STREAMS_SHAPE.interval_ms} ms apart, plus #{STREAMS_FAST_CONNECTIONS} " \
                                         "keep-alive clients on a fast endpoint, 2 workers")

  WORKLOADS = [
    Workload.new(name: "hello_length", app: "hello_length", cells: ALL_CELLS,
                 quick_cells: [%w[tcp keepalive], %w[unix close]], ceiling: true, yjit: true, quick_yjit: true,
                 without_yjit: true, title: "hello world with Content-Length"),
    Workload.new(name: "hello", app: "hello", cells: UNIX_KA, quick_cells: UNIX_KA, ceiling: true,
                 quick_servers: %w[blackbuck unicorn pitchfork nginx], # the three framings: length, EOF, chunked
                 title: "hello world, no Content-Length (seed app: chunked or close-delimited)"),
    Workload.new(name: "iowait", app: "iowait", cells: UNIX_KA, quick_cells: UNIX_KA, duration: MIXED_DURATION_S,
                 threaded: %w[blackbuck-2x2 blackbuck-2x5],
                 title: "10 ms wait per request (a database call), 50 keep-alive clients"),
    Workload.new(name: "iowait_burst", app: "iowait", cells: UNIX_KA, quick_cells: UNIX_KA, duration: MIXED_DURATION_S,
                 driver: "h2load", quick_servers: %w[blackbuck blackbuck-2x5 unicorn puma8-2x5], threaded: %w[blackbuck-2x5],
                 title: "10 ms wait per request, the 50 connections opened at once (h2load)"),
    Workload.new(name: "mixed", app: "mixed", cells: UNIX_KA, quick_cells: UNIX_KA, workers: MIXED_WORKERS,
                 connections: MIXED_TARGETS.sum { |t| t["weight"] }, duration: MIXED_DURATION_S,
                 targets: MIXED_TARGETS, threaded: %w[blackbuck-2x2 blackbuck-2x5 puma8-2x2],
                 title: "mixed: 16 clients on a 2 ms endpoint + 2 on a 300 ms one, #{MIXED_WORKERS} workers"),
    Workload.new(name: "mixed_nginx", app: "mixed", cells: UNIX_KA, quick_cells: UNIX_KA, workers: MIXED_WORKERS,
                 connections: MIXED_TARGETS.sum { |t| t["weight"] }, duration: MIXED_DURATION_S,
                 targets: MIXED_TARGETS, front: "nginx", quick_servers: %w[blackbuck blackbuck-2x2 unicorn puma8-2x2],
                 threaded: %w[blackbuck-2x2 puma8-2x2],
                 title: "mixed behind nginx (upstream keep-alive, docs/DEPLOY.md), #{MIXED_WORKERS} workers"),
    Workload.new(name: "sinatra", app: "sinatra", cells: UNIX_KA, quick_cells: UNIX_KA, yjit: true,
                 title: "Sinatra hello (Debian ruby-sinatra)"),
    Workload.new(name: "big", app: "big", cells: UNIX_KA, quick_cells: UNIX_KA, ceiling: true, yjit: true,
                 quick_servers: %w[blackbuck unicorn puma8-2x1 iodine-2x1 itsi-2x1 nginx],
                 title: "64 KiB response"),
    Workload.new(name: "rails", app: "rails", cells: UNIX_KA, quick_cells: UNIX_KA, yjit: true, rails: true,
                 without_yjit: true, title: "Rails API endpoint rendering JSON (Rails 6.1 on Rack 2.2 on Ruby 3.1, 8.1 on Rack 3.1 on 3.4 and 4.0)"),
    MEMORY_WORKLOAD,
    STREAMS_WORKLOAD
  ].freeze

  # A full run: every workload but the seed hello (its framing is in hello_length's probe; name
  # it, or BENCH_ONLY=hello, to measure it).
  DEFAULT_WORKLOADS = (WORKLOADS.map(&:name) - %w[hello]).freeze

  # The Rails and Rack the rails workload runs on a Ruby: Debian's Rails 6.1 (Rack 2.2) on Debian's
  # 3.1, Rails 8.1 (gemfiles/rails8.gemfile: Rack 3.1) on 3.4 and 4.0, installed by bin/setup with
  # that Ruby (test/matrix.rb's lanes). gemfile: Blackbuck's bundle; preload: required first by the
  # peers (RUBYOPT=-r) so that RubyGems activates the same Rack; env: what rails.ru reads.
  RailsStack = Struct.new(:gemfile, :preload, :env, keyword_init: true) do
    def self.for(ruby)
      lib = File.expand_path("../../apps/lib", __dir__)
      root = File.expand_path("../../..", __dir__)
      if ruby.debian?
        new(gemfile: File.join(root, "gemfiles", "rails61.gemfile"), preload: File.join(lib, "rack2.rb"),
            env: { "BENCH_RAILS" => "~> 6.1.0" })
      else
        require File.join(root, "test", "matrix")
        new(gemfile: TestMatrix.gemfile("gemfiles/rails8.gemfile", version: ruby.version), preload: File.join(lib, "rack31.rb"),
            env: { "BENCH_RAILS" => "8.1.3" })
      end
    end
  end

  def self.workload(name) = WORKLOADS.find { |w| w.name == name } || raise(ArgumentError, "unknown workload #{name}")

  # BENCH_ONLY=NAME (or --only NAME): a named subset of the full run. servers: nil = the run's.
  SUBSETS = {
    "hello" => { workloads: %w[hello_length hello] },
    "iowait" => { workloads: %w[iowait iowait_burst] },
    "mixed" => { workloads: %w[mixed mixed_nginx] },
    "rails" => { workloads: %w[rails] },
    "sinatra" => { workloads: %w[sinatra] },
    "big" => { workloads: %w[big] },
    "memory" => { workloads: %w[memory] },
    "streams" => { workloads: %w[streams] },
    # YJIT against no YJIT: the workloads the twins run, Ruby servers only
    "yjit" => { workloads: WORKLOADS.select(&:yjit).map(&:name), servers: :ruby_with_twins },
    # the new peers against Blackbuck on the hello workload, UNIX socket keep-alive
    "peers" => { workloads: %w[hello_length], transports: %w[unix], modes: %w[keepalive] }
  }.freeze
end
