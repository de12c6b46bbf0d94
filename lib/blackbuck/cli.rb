# frozen_string_literal: true

require "optparse"
require "rbconfig"
require_relative "version"
require_relative "errors"
require_relative "logger"
require_relative "config"
require_relative "allocator"
require_relative "app_source"
require_relative "option_errors"

module Blackbuck
  # `blackbuck [options] [RACKUP_FILE]`: options -> Config (file first, then the command
  # line), app loaded from the rackup file, then Server.run. Every mistake is one line on
  # stderr and a non-zero exit (2 for usage, 1 for everything else), never a backtrace.
  class CLI
    def initialize(argv, env: ENV, out: $stdout, err: $stderr)
      @argv = argv.dup
      @env = env
      @out = out
      @err = err
      @overrides = []
    end

    def run
      case @argv.first
      when "status" # `blackbuck status [--json] [-c FILE] [ADDR]`: a client of --stats-listen, not a server
        require_relative "status_client"
        return StatusClient.new(@argv.drop(1), env: @env, out: @out, err: @err).run
      end
      argv = @argv.dup
      parser = option_parser
      rest = parser.parse(@argv)
      raise OptionParser::InvalidArgument, "too many rackup files: #{rest.join(' ')}" if rest.size > 1
      if @proxy_protocol && @overrides.none? { |k, _| k == :listen_one }
        raise OptionParser::InvalidArgument, "--proxy-protocol applies to the listeners given with -l, and there is none"
      end

      require_relative "../blackbuck"
      config = Config.new
      file = @config_file || (Config::DEFAULT_FILE if File.file?(Config::DEFAULT_FILE))
      if file
        Config::DSL.load(config, file)
        config.set(:config_file, file)
      end
      # where the status listener's address comes from, for a boot error about it
      @stats_origin = ("stats_listen in #{file}" if file && config[:stats_listen])
      @stats_origin = "--stats-listen" if @overrides.any? { |k, _| k == :stats_listen }
      @overrides.each do |k, v|
        config.set(k, k == :listen_one && @proxy_protocol ? Config::Listen.new(v, true) : v)
      end
      config.set(:rackup, rest.first) if rest.first
      config.finalize!(@env)
      @debug = config[:debug]
      refuse_without_jobs(config)
      reexec_for_jemalloc(argv) if config[:jemalloc] # before the app loads: malloc is bound at exec
      setup_yjit(argv, config) # before the app loads: its memory limit is given when YJIT starts
      # Reforking: the master does not load the app, a mold does (Refork), so nothing of it stays in
      # the master once a refork makes a warmer mold. --check loads it here, as ever.
      source = if !config[:refork_after].empty? && !@check
                 AppSource.booted_by_mold(-> { load_app(config) }, config)
               else
                 AppSource.preloaded(load_app(config), config)
               end
      if @check
        # HUP's boot check runs the warm-up too: new code whose warm-up fails must not be exec'd
        source.warm_up(Logger.new(@err, debug: @debug))
        @out.puts "blackbuck: #{config[:rackup]} boots (#{Logger.count(config[:workers], 'worker')}, #{config[:listen].join(' ')})"
        return 0
      end
      Reexec.command = [RbConfig.ruby, File.expand_path($PROGRAM_NAME), *argv]
      cmdline = Allocator.command(argv) # [ruby, *options, script, *argv]
      Reexec.ruby_options = Reexec.jit_options(cmdline[1...(cmdline.size - argv.size - 1)])
      Server.run(config, source)
    rescue OptionParser::ParseError => e
      @err.puts "blackbuck: #{OptionErrors.line(e, parser)} (see blackbuck --help)"
      2
    rescue ConfigError, LoadError => e
      say_error(@stats_origin && e.respond_to?(:with_origin) ? e.with_origin(@stats_origin) : e)
      1
    rescue Interrupt
      1
    end

    private

    def set(key) = ->(v) { @overrides << [key, v] }

    # The option that sets key, its help text saying the setting's default where it has
    # "%{default}": read from Config::DEFAULTS, so the help writes no default of its own
    # (test/unit/cli_help_test.rb holds it to that).
    def defaulted(parser, key, *switches_and_text)
      parser.on(*switches_and_text.map { |s| s.sub("%{default}") { default_of(key) } }, &set(key))
    end

    # A setting's default as the help states it: true/false read on/off.
    def default_of(key)
      case (value = Config::DEFAULTS.fetch(key))
      when true then "on"
      when false then "off"
      else value.to_s
      end
    end

    # Serving files the app names is off unless X-Sendfile or an X-Accel-Redirect mapping is set.
    def files_default = Config::DEFAULTS[:x_sendfile] || Config::DEFAULTS[:x_accel_mapping].any? ? "on" : "off"

    # One line on stderr, "blackbuck: message" (a message of several lines joined with " / ").
    # With --debug (or BLACKBUCK_DEBUG=1) the whole message and the backtrace of what went wrong
    # follow, as one entry whose further lines are indented.
    def say_error(err)
      cause = err.cause || err
      if debug? && cause.backtrace
        @err.puts Logger.entry_text("blackbuck: #{err.message}\n#{cause.class}: #{cause.message}\n#{cause.backtrace.join("\n")}")
      else
        @err.puts "blackbuck: #{err.message.lines.map(&:strip).reject(&:empty?).join(' / ')}"
      end
    end

    # solid_queue (or $SOLID_QUEUE_IN_PUMA) without the app's bin/jobs: the jobs would silently not
    # run, so the server does not start (the --check of a HUP fails the same way: the old code serves on).
    def refuse_without_jobs(config)
      require_relative "master/jobs"
      why = config[:solid_queue] && Jobs.missing(config)
      raise ConfigError, why if why
    end

    # `jemalloc true`, not running on it yet: the same command again with LD_PRELOAD naming it (same
    # pid, so systemd and pid files see one process). Raises ConfigError when it cannot be loaded.
    def reexec_for_jemalloc(argv)
      allocator = Allocator.new(env: @env)
      return unless (env = allocator.reexec_for_jemalloc)

      Kernel.exec(env, *Allocator.command(argv))
    rescue SystemCallError => e # the exec itself failed: this process is still the old one
      raise ConfigError, "jemalloc is set, but restarting with LD_PRELOAD=#{env['LD_PRELOAD']} failed: #{e.message}"
    end

    # `yjit`, `yjit_mem_size`: YJIT started here (Ruby 4.0 takes the limit in RubyVM::YJIT.enable),
    # or this command exec'd again with the Ruby option that sets it (same pid, as for jemalloc).
    def setup_yjit(argv, config)
      step, arg = YJIT.plan_for(config, reexec: true, env: @env)
      @env.delete(YJIT::REEXEC_ENV) # read: not handed to the app's subprocesses, nor to a HUP's new image
      case step
      when :enable then YJIT.enable(arg)
      when :warn then Logger.new(@err).warn("YJIT: #{arg}")
      when :error then raise ConfigError, arg
      when :reexec
        ruby, *rest = Allocator.command(argv)
        options = YJIT.options(config[:yjit_mem_size]).reject { |o| rest.include?(o) }
        Kernel.exec({ YJIT::REEXEC_ENV => "1" }, ruby, *options, *rest)
      end
    rescue SystemCallError => e # the exec itself failed: this process is still the old one
      raise ConfigError, "yjit is set, but restarting with #{YJIT.options(config[:yjit_mem_size]).join(' ')} failed: #{e.message}"
    end

    def debug? = @debug || %w[1 true yes on].include?(@env["BLACKBUCK_DEBUG"].to_s)

    def option_parser
      OptionParser.new do |o|
        o.banner = "Usage: blackbuck [options] [RACKUP_FILE (default: #{default_of(:rackup)})]"
        o.separator ""
        o.separator "Commands:"
        o.separator "    blackbuck status [--json] [-c FILE] [ADDR]"
        o.separator "                                     a running master's workers, requests and queues from its"
        o.separator "                                     --stats-listen ADDR (default: stats_listen of FILE, else"
        o.separator "                                     $BLACKBUCK_STATS); blackbuck status --help for more"
        o.separator ""
        o.separator "Listening:"
        o.on("-l", "--listen ADDR", "HOST:PORT, :PORT, PORT, [::1]:PORT, /path.sock or unix:/path.sock (repeatable)",
             &set(:listen_one))
        defaulted(o, :host, "-o", "--host HOST", "host to bind when no --listen is given (default %{default})")
        o.on("-p", "--port PORT", "port to bind when no --listen is given (default $PORT or #{Config::DEFAULT_PORT})",
             &set(:port))
        o.on("--proxy-protocol", "every -l listener of the command line expects a PROXY protocol header (v1 or v2)",
             "from a load balancer first; only for listeners only it can reach (docs/SECURITY.md)") do
          @proxy_protocol = true
        end
        defaulted(o, :backlog, "--backlog N", "listen queue length (default %{default})")
        o.on("--unix-socket-mode MODE", "file mode of UNIX sockets, e.g. 0660", &set(:unix_socket_mode))
        o.on("--unix-socket-group GROUP", "group of UNIX sockets, a name or gid (e.g. www-data for nginx)",
             &set(:unix_socket_group))
        o.separator ""
        o.separator "Processes:"
        o.on("-w", "--workers N", "worker processes (default $WEB_CONCURRENCY or the CPU count; " \
                                          "$WEB_CONCURRENCY=auto: the CPU count)",
             &set(:workers))
        defaulted(o, :threads, "--threads N",
                  "app threads per worker (default $RAILS_MAX_THREADS, else %{default}: the app never runs " \
                  "concurrently with itself)")
        o.on("--max-requests-per-child N", "recycle a worker after N requests (0 = never)", &set(:max_requests_per_child))
        o.on("--min-requests-per-child N", "each worker's limit is random in [min, max]", &set(:min_requests_per_child))
        o.on("-t", "--timeout SEC", "a request running longer is answered 503 and its worker replaced " \
                                    "(default #{Config::REQUEST_TIMEOUT}; off in development; 0 = off)", &set(:timeout))
        defaulted(o, :graceful_timeout, "--graceful-timeout SEC",
                  "how long TERM waits for in-flight requests (default %{default})")
        defaulted(o, :shutdown_delay, "--shutdown-delay SEC",
                  "after TERM keep serving SEC seconds while GET /ready answers 503, then stop " \
                  "(default %{default}; Kubernetes)")
        o.on("--oob-gc N", "run GC between requests every N requests (0 = off)", &set(:oob_gc))
        o.on("--[no-]oob-gc-auto", "run a minor GC between requests when GC.stat says one is near", &set(:oob_gc_auto))
        defaulted(o, :oob_major_gc, "--[no-]oob-major-gc",
                  "Ruby >= 3.4: workers run no major GC by themselves; one runs between requests when Ruby " \
                  "says it is due (default %{default}; docs/CONFIGURATION.md, oob_major_gc)")
        o.on("--max-memory-per-child KIB", "recycle a worker whose USS (its private memory) passes KIB (0 = off)", &set(:max_memory_per_child))
        defaulted(o, :jemalloc, "--[no-]jemalloc",
                  "run on jemalloc: restart at once with libjemalloc2 in LD_PRELOAD (default %{default}; " \
                  "docs/DEPLOY.md, Memory)")
        defaulted(o, :yjit, "--[no-]yjit",
                  "start YJIT in the master before the app loads (default %{default}: as Ruby and the app decide)")
        o.on("--yjit-mem-size MIB", "YJIT's memory limit, set the way this Ruby takes it (implies --yjit; " \
                                    "docs/DEPLOY.md, Memory)", &set(:yjit_mem_size))
        defaulted(o, :sched_batch, "--[no-]sched-batch",
                  "run workers under SCHED_BATCH on Linux (default %{default}; see docs/CONFIGURATION.md)")
        defaulted(o, :handoff_after, "--handoff-after SEC",
                  "move requests waiting on a busy worker's connections to a free worker once " \
                  "its app has run SEC (default %{default}; 0 = never)")
        defaulted(o, :max_queue_time, "--max-queue-time SEC",
                  "answer 503 + Retry-After to a request that waited longer for the app (default %{default} = off)")
        o.on("--[no-]solid-queue", "run the app's bin/jobs (Solid Queue) as a child of the master, stopped and " \
                                   "restarted with the server (on by default when $SOLID_QUEUE_IN_PUMA is set)",
             &set(:solid_queue))
        o.on("--restart-file FILE", "a change of FILE's mtime restarts the server as HUP does (by default " \
                                    "#{Config::RESTART_FILE} when the app's directory has tmp/: `bin/rails restart`)",
             &set(:restart_file))
        o.on("--no-restart-file", "no restart file") { @overrides << [:restart_file, false] }
        o.on("--stats-listen ADDR", "serve GET /status (JSON) and GET /metrics (Prometheus) on ADDR; a bare PORT " \
                                    "is 127.0.0.1:PORT (0.0.0.0:PORT for every interface)", &set(:stats_listen))
        o.separator ""
        o.separator "Files named by the app (#{files_default} by default; see docs/SECURITY.md):"
        o.on("--[no-]x-sendfile", "send the file a response names in X-Sendfile: /abs/path", &set(:x_sendfile))
        o.on("--x-accel-mapping PREFIX=DIR", "serve X-Accel-Redirect: PREFIX/rest from DIR/rest (repeatable)",
             &set(:x_accel_mapping))
        o.separator ""
        o.separator "Connections:"
        defaulted(o, :trust_forwarded_proto, "--[no-]trust-forwarded-proto",
                  "X-Forwarded-Proto/-Ssl/-Scheme: https set rack.url_scheme (default %{default}; " \
                  "turn off when clients reach the server directly)")
        defaulted(o, :keepalive, "--[no-]keepalive", "HTTP persistent connections (default %{default})")
        defaulted(o, :early_hints, "--[no-]early-hints",
                  "offer rack.early_hints: 103 responses (default %{default}; nginx before 1.29 and many " \
                  "proxies cannot pass a 103 on)")
        defaulted(o, :streams, "--[no-]streams",
                  "a streamed body that waits (SSE, a Rack 3 callable body) runs on a fiber and the worker " \
                  "serves on meanwhile (default %{default}; threads 1 only)")
        defaulted(o, :keepalive_timeout, "--keepalive-timeout SEC",
                  "idle keep-alive connections close after SEC (default %{default})")
        defaulted(o, :max_keepalive_requests, "--max-keepalive-requests N", "requests per connection (default %{default})")
        defaulted(o, :max_connections, "--max-connections N", "open connections per worker (default %{default})")
        defaulted(o, :header_timeout, "--header-timeout SEC",
                  "time to receive a request head, else 408 (default %{default})")
        defaulted(o, :body_timeout, "--body-timeout SEC", "time without request-body bytes, else 408 (default %{default})")
        defaulted(o, :min_body_rate, "--min-body-rate BYTES",
                  "bytes/s a body must average after 10 s, else 408 (default %{default}; 0 = off)")
        defaulted(o, :write_timeout, "--write-timeout SEC", "time a client may stop reading a response (default %{default})")
        defaulted(o, :response_buffer, "--response-buffer BYTES",
                  "response bytes a client has not taken kept in memory (default %{default})")
        defaulted(o, :max_response_spill, "--max-response-spill BYTES",
                  "more of them in a file in $TMPDIR, then held in memory (default %{default}; 0 = never spill)")
        defaulted(o, :max_worker_spill, "--max-worker-spill BYTES",
                  "all of one worker's spill files together (default %{default})")
        o.separator ""
        o.separator "Limits:"
        defaulted(o, :max_request_line, "--max-request-line BYTES", "request line, else 414 (default %{default})")
        defaulted(o, :max_uri, "--max-uri BYTES", "request target, else 414 (default %{default})")
        defaulted(o, :max_headers, "--max-headers N", "header fields, else 431 (default %{default})")
        defaulted(o, :max_header_bytes, "--max-header-bytes BYTES", "request head, else 431 (default %{default})")
        defaulted(o, :max_body, "--max-body BYTES", "request body, else 413 (default %{default}; 0 = no limit)")
        defaulted(o, :body_buffer, "--body-buffer BYTES", "bodies larger than this go to a tempfile (default %{default})")
        o.separator ""
        o.separator "Other:"
        o.on("-c", "--config FILE",
             "Ruby config file (default #{Config::DEFAULT_FILE} when present; see docs/CONFIGURATION.md)") do |f|
          @config_file = f
        end
        o.on("-E", "--env ENV", "RACK_ENV (default $RACK_ENV, else $RAILS_ENV, else #{Config::DEFAULT_ENVIRONMENT})",
             &set(:environment))
        o.on("-P", "--pid FILE", "write the master's pid to FILE (default $PIDFILE)", &set(:pid))
        o.on("--log FILE", "append log lines to FILE instead of stderr (reopened on USR1)", &set(:log))
        o.on("--check", "load the config and the app, report, and exit without serving") { @check = true }
        o.on("--debug", "DEBUG log entries, and the whole backtrace of a boot error (also BLACKBUCK_DEBUG=1)") do
          @overrides << [:debug, true]
          @debug = true
        end
        o.on("-v", "--version", "print the version and exit") do
          @out.puts "blackbuck #{VERSION}"
          exit 0
        end
        o.on("-h", "--help", "print this help and exit") do
          @out.puts o
          exit 0
        end
      end
    end

    def load_app(config)
      path = config[:rackup]
      raise ConfigError, "rackup file #{path} not found" unless File.file?(path)

      ENV["RACK_ENV"] = config[:environment]
      require "rack"
      require "rack/builder"
      app = Rack::Builder.parse_file(path)
      app = app.first if app.is_a?(Array) # Rack 2 returns [app, options]
      raise ConfigError, "#{path} did not produce a Rack app (got #{app.class})" unless app.respond_to?(:call)

      RequestTimeout.register_with_rails
      app
    rescue ConfigError
      raise
    rescue SyntaxError => e
      line = ConfigError.syntax(e) # "path:LINE: syntax error, ..."
      raise ConfigError, "cannot load #{line.start_with?("#{path}:") ? line : "#{path}: #{line}"}"
    rescue ScriptError, StandardError => e
      where = origin(e, File.dirname(File.expand_path(path)))
      raise ConfigError, "cannot load #{path}: #{e.class}: #{e.message}#{" (#{where})" if where}"
    end

    # Where a boot error comes from: the first frame of the backtrace inside the app's directory
    # (a Rails initializer, a model), not bundled gems; else the first frame. Relative to the app.
    def origin(err, app_dir)
      frames = (err.backtrace || []).map { |l| l.split(":in ", 2).first }
      own = frames.find do |f|
        full = File.expand_path(f)
        full.start_with?("#{app_dir}/") && !full.include?("/vendor/") && !full.include?("/gems/")
      end
      frame = own || frames.first
      return nil unless frame

      full = File.expand_path(frame)
      full.start_with?("#{app_dir}/") ? full.delete_prefix("#{app_dir}/") : frame
    end
  end
end
