# frozen_string_literal: true

require "etc"
require_relative "errors"
require_relative "cpu_quota"
require_relative "listeners"
require_relative "memory"

module Blackbuck
  # Every setting of the server: defaults in one hash, each directive validated by a tiny
  # setter, errors naming the directive. The CLI, the config file (Config::DSL) and the rack
  # handler all go through #set. docs/CONFIGURATION.md documents each key.
  class Config
    KIB = 1024
    MIB = 1024 * KIB
    MAX_THREADS = 256 # app threads per worker at most
    YJIT_MAX_MEM_MIB = 4096 # yjit_mem_size at most, MiB
    REQUEST_TIMEOUT = 60 # seconds: the timeout setting's default outside development
    DEFAULT_PORT = 9292  # the port setting's default when $PORT is not set
    DEFAULT_ENVIRONMENT = "development" # the environment setting's default without $RACK_ENV or $RAILS_ENV
    RESTART_FILE = "tmp/restart.txt"   # restart_file's default, in the app's directory (what `bin/rails restart` touches)
    JOBS_COMMAND = "bin/jobs"          # what solid_queue runs, in the app's directory (Rails 8 generates it)

    # One entry of the listen list: an address (as Listeners.parse reads it) and whether every
    # connection to it starts with a PROXY protocol header from a load balancer.
    Listen = Struct.new(:address, :proxy_protocol) do
      def to_s = address
    end

    DEFAULTS = {
      listen: [],                     # Listen entries; empty -> "#{host}:#{port}"
      host: "0.0.0.0",
      port: nil,                      # nil -> $PORT, else DEFAULT_PORT
      backlog: 1024,                  # listen(2) queue length
      unix_socket_mode: nil,          # e.g. 0o660; nil keeps the umask's
      unix_socket_group: nil,         # gid (set from a group name or number); nil keeps the process's group
      workers: nil,                   # nil -> $WEB_CONCURRENCY (a count or "auto"), else Config.cpus (the CPU count, or the
                                      # cgroup CPU quota if fewer)
      threads: 1,                     # app threads per worker; 1 = the app never runs concurrently with itself;
                                      # $RAILS_MAX_THREADS when neither the file nor the command line sets it
      rackup: "config.ru",
      config_file: nil,               # the config file read (-c FILE, or config/blackbuck.rb when present); not a directive
      environment: nil,               # nil -> $RACK_ENV, else $RAILS_ENV, else DEFAULT_ENVIRONMENT
      debug: false,                   # DEBUG log entries and full boot-error backtraces; also BLACKBUCK_DEBUG=1
      pid: nil,                       # pid file path; nil -> $PIDFILE, else none
      restart_file: nil,              # a file whose mtime change restarts the server as HUP does (`bin/rails restart`
                                      # touches tmp/restart.txt); nil -> tmp/restart.txt of the app's directory when
                                      # that has a tmp/ directory (a Rails app), else none; false = off
      solid_queue: nil,               # run the app's bin/jobs (Solid Queue's supervisor) as a child of the master;
                                      # nil -> on when $SOLID_QUEUE_IN_PUMA is set (as Rails' config/puma.rb), else off
      log: nil,                       # log file path; nil -> stderr
      max_requests_per_child: 0,      # requests; 0 = never recycle
      min_requests_per_child: nil,    # requests; each worker's limit is random in [min, max]
      timeout: nil,                   # seconds a request may run before the worker is replaced; 0 = off;
                                      # nil -> REQUEST_TIMEOUT, or 0 in development (a debugger's prompt)
      graceful_timeout: 30,           # seconds TERM waits for in-flight requests
      shutdown_delay: 0,              # seconds TERM keeps serving (GET /ready says 503) before the graceful stop
      max_queue_time: 0,              # seconds a request may have waited for the app, else 503 + Retry-After; 0 = off
      handoff_after: 0.002,           # seconds the app may run before requests waiting on the worker's other
                                      # connections move to a free worker; 0 = never move
      keepalive: true,
      keepalive_timeout: 75,          # seconds an idle keep-alive connection is kept (> common LB idle of 60 s)
      max_keepalive_requests: 1000,   # requests per connection, then "Connection: close"; 0 = no cap
      header_timeout: 30,             # seconds to receive a whole request head -> 408
      body_timeout: 30,               # seconds without a byte of request body -> 408
      write_timeout: 30,              # seconds a client may stop reading the response
      max_connections: 1024,          # open client connections per worker; at the cap a worker stops accepting
      max_request_line: 8 * KIB,      # bytes -> 414
      max_uri: 8 * KIB,               # bytes -> 414
      max_headers: 100,               # header fields -> 431
      max_header_bytes: 64 * KIB,     # bytes of request head -> 431
      max_body: 100 * MIB,            # bytes of request body -> 413 (0 = no limit)
      body_buffer: 112 * KIB,         # bytes; larger bodies are spilled to a tempfile
      response_buffer: 1 * MIB,       # bytes of response a client has not taken kept in memory, per connection
      max_response_spill: 1024 * MIB, # bytes more in a spill file in $TMPDIR, per connection; past it the
                                      # rest is held in memory (BB_OUT_HELD_MAX), then cut; 0 = never spill
      max_worker_spill: 4096 * MIB,   # bytes all of one worker's spill files may hold together; past it, as above
      oob_gc: 0,                      # run GC between requests every N requests; 0 = off
      oob_gc_auto: false,             # run a minor GC between requests when GC.stat says one is near
      oob_major_gc: false,            # Ruby >= 3.4: workers run no major GC by themselves, one runs between requests
                                      # when Ruby says it is due (docs/CONFIGURATION.md: why it is off by default)
      min_body_rate: 1024,            # bytes/s a request body must average after its first 10 s, else 408; 0 = off
      max_memory_per_child: 0,        # KiB of USS (private pages) after which a worker is recycled; 0 = off
      refork_after: [],               # requests: a worker of generation g that has served refork_after[g] forks
                                      # the mold new workers fork from, and exits (docs/REFORKING.md); [] = off
      sched_batch: false,             # workers run under SCHED_BATCH (Linux): fewer switches, but a worst tail when the CPU is shared
      jemalloc: false,                # the blackbuck command execs itself with libjemalloc in LD_PRELOAD (Allocator)
      malloc_arena_max: nil,          # glibc arenas; nil -> 2 with threads > 1 (unless $MALLOC_ARENA_MAX), else glibc's own
      yjit: false,                    # true: YJIT on in the master before the app loads (false: as Ruby and the app decide)
      yjit_mem_size: nil,             # MiB: YJIT's memory limit (implies yjit); nil -> Ruby's default (YJIT)
      stats_listen: nil,              # address of the status listener (GET /status, GET /metrics); nil = off
      trust_forwarded_proto: true,    # X-Forwarded-Proto/-Ssl/-Scheme set rack.url_scheme (off when clients reach us directly)
      streams: false,                 # a streamed body (each, or a Rack 3 callable body) that waits runs on a fiber
                                      # of its own and the worker serves on meanwhile (threads 1 only; docs/ARCHITECTURE.md)
      early_hints: false,             # offer rack.early_hints (103) to apps; off: nginx < 1.29 and most proxies
                                      # cannot pass a 1xx on (Rails' asset tags send one on every HTML page)
      x_sendfile: false,              # send the file an app names in X-Sendfile (a path from the app: trusted)
      x_accel_mapping: [],            # [[uri_prefix, directory]] for X-Accel-Redirect; empty = off
      warmup_paths: [].freeze,        # paths GET through the app in the master before the first fork (the warmup
                                      # directive); a 5xx or an exception fails the boot, a 4xx is a warning
      warmup: nil,                    # proc(app), in the master after warmup_paths, before the first fork
      gc_before_fork: true,           # prepare the heap before the first fork: Process.warmup on Ruby >= 3.3, else
                                      # coderanges, full GCs until nothing more is promoted, GC.compact, malloc_trim
      before_fork: nil,               # proc(server, worker_index), in the master
      after_fork: nil,                # proc(server, worker_index), in the worker
      after_refork: nil,              # proc(server), in a mold a worker forked (refork_after), before it forks a worker
      after_worker_exit: nil,         # proc(server, worker_index, Process::Status), in the master
      before_exec: nil                # proc(server), before a re-exec (hot restart)
    }.freeze

    HOOKS = %i[before_fork after_fork after_refork after_worker_exit before_exec].freeze
    DEFAULT_FILE = "config/blackbuck.rb" # read when present and no -c FILE is given (like config/puma.rb)

    # The default worker count: the CPUs this process may use (its affinity), or fewer when a
    # cgroup CPU quota allows fewer (1.5 CPUs -> 2 workers).
    def self.cpus(quota = CpuQuota.cpus)
      n = Etc.nprocessors
      quota ? quota.ceil.clamp(1, n) : n
    end

    # Is key a setting (of the config file, -O NAME=VALUE, #set)?
    def self.setting?(key) = DEFAULTS.key?(key.to_sym) && key.to_sym != :config_file

    attr_reader :values

    def initialize
      @values = DEFAULTS.dup
      @values[:listen] = []
      @values[:x_accel_mapping] = []
      @given = {}   # key => true once #set (the config file, the command line, a rack handler's options)
      @origins = {} # key => "$VAR" or "$VAR=value" for a value #finalize! took from the environment
    end

    def [](key) = @values.fetch(key)

    # Where a value came from when the environment gave it ("$WEB_CONCURRENCY=auto",
    # "$RAILS_MAX_THREADS"), else nil: for the boot line.
    def origin(key) = @origins[key]

    # The directory of the app: where its rackup file is (a Rails app's root).
    def app_dir = File.dirname(File.expand_path(@values[:rackup]))

    def set(key, value)
      key = key.to_sym
      raise ConfigError, "unknown setting #{key}" unless DEFAULTS.key?(key) || key == :listen_one

      @given[key] = true
      case key
      when :listen # the whole list (listen_one adds one)
        @values[:listen] = []
        Array(value).each { |a| set(:listen_one, a) }
      when :listen_one then @values[:listen] << listen_entry(value)
      when :host, :rackup, :pid, :log, :config_file then @values[key] = string(key, value)
      when :environment then @values[key] = string(key, value.is_a?(Symbol) ? value.to_s : value) # -E, or :production
      when :stats_listen then @values[key] = value.nil? ? nil : address(key, value.is_a?(Integer) ? value.to_s : value)
      when :port then @values[key] = int(key, value, 0, 65_535)
      when :oob_major_gc then @values[key] = major_gc(key, value)
      when :keepalive, :oob_gc_auto, :sched_batch, :debug, :trust_forwarded_proto, :x_sendfile, :early_hints,
           :gc_before_fork, :streams
        @values[key] = bool(key, value)
      when :x_accel_mapping then Array(value).each { |m| @values[key] << accel_mapping(key, m) }
      when :unix_socket_mode then @values[key] = mode(key, value)
      when :unix_socket_group then @values[key] = group(key, value)
      when :workers then @values[key] = int(key, value, 1, 4096)
      when :threads then @values[key] = int(key, value, 1, MAX_THREADS)
      when :graceful_timeout, :keepalive_timeout, :header_timeout, :body_timeout, :write_timeout
        @values[key] = seconds(key, value)
      when :timeout then @values[key] = seconds(key, value, off: true)
      when :shutdown_delay, :max_queue_time, :handoff_after then @values[key] = seconds(key, value, zero: true)
      when :max_headers then @values[key] = int(key, value, 1, 1000)
      when :max_connections then @values[key] = int(key, value, 1, 1_000_000)
      when :refork_after then @values[key] = request_steps(key, value)
      when :min_requests_per_child
        @values[key] = value.nil? ? nil : int(key, value, 0)
      when :jemalloc, :yjit then @values[key] = bool(key, value)
      when :yjit_mem_size then @values[key] = value.nil? ? nil : int(key, value, 1, YJIT_MAX_MEM_MIB)
      when :solid_queue then @values[key] = value.nil? ? nil : bool(key, value)
      when :restart_file then @values[key] = restart_file(key, value)
      when :malloc_arena_max then @values[key] = value.nil? ? nil : int(key, value, 1, 1024)
      when *HOOKS then @values[key] = hook(key, value)
      when :warmup then @values[key] = value.nil? ? nil : hook(key, value)
      when :warmup_paths then @values[key] = paths(key, value)
      else @values[key] = int(key, value, key.to_s.start_with?("max_request_line", "max_uri", "max_header") ? 64 : 0)
      end
      self
    end

    # Values derived once the sources are merged. The environment's variables fill only what the
    # config file and the command line left unset (as Rails' generated config/puma.rb reads them);
    # a blank one counts as unset (as Puma). one_in_development: the worker count's default is 1 in
    # development (a framework's development server: `rails server`, rackup), not one per CPU.
    def finalize!(env = ENV, one_in_development: false)
      @values[:environment] ||= env["RACK_ENV"] || env["RAILS_ENV"] || DEFAULT_ENVIRONMENT
      @values[:port] ||= from_env(env, :port, "PORT") { |v| int(:port, v, 0, 65_535) } || DEFAULT_PORT
      @values[:workers] ||= from_env(env, :workers, "WEB_CONCURRENCY") { |v| workers_from_env(v) } ||
                            development_workers(one_in_development) || Config.cpus
      unless @given[:threads]
        @values[:threads] = from_env(env, :threads, "RAILS_MAX_THREADS") { |v| int(:threads, v, 1, MAX_THREADS) } ||
                            @values[:threads]
      end
      @values[:pid] ||= from_env(env, :pid, "PIDFILE") { |v| v }
      if @values[:solid_queue].nil?
        # Rails' config/puma.rb: `plugin :solid_queue if ENV["SOLID_QUEUE_IN_PUMA"]`: any value, even "false"
        @values[:solid_queue] = !env["SOLID_QUEUE_IN_PUMA"].nil?
        @origins[:solid_queue] = "$SOLID_QUEUE_IN_PUMA" if @values[:solid_queue]
      end
      file = @values[:restart_file]
      @values[:restart_file] = file.nil? ? default_restart_file : file && File.expand_path(file, app_dir)
      # No request timeout in development unless one is set (as Puma): a developer at a `debugger`
      # prompt must not have the worker replaced under them.
      @values[:timeout] ||= @values[:environment] == "development" ? 0 : REQUEST_TIMEOUT
      @values[:debug] ||= bool(:BLACKBUCK_DEBUG, env["BLACKBUCK_DEBUG"]) if env["BLACKBUCK_DEBUG"]
      if @values[:listen].empty?
        host = @values[:host]
        host = "[#{host}]" if host.include?(":") && !host.start_with?("[") # an IPv6 address: -o ::1, rails server -b ::1
        @values[:listen] = [listen_entry("#{host}:#{@values[:port]}")]
      end
      min = @values[:min_requests_per_child]
      max = @values[:max_requests_per_child]
      if min && max.positive? && min > max
        raise ConfigError, "min_requests_per_child (#{min}) is larger than max_requests_per_child (#{max})"
      end

      self
    end

    private

    # The variable's value through the block (whose ConfigError is reworded to name the variable),
    # or nil when it is unset or blank. Records where the value came from.
    def from_env(env, key, var)
      raw = env[var]
      return nil if raw.nil? || raw.strip.empty?

      value = yield(raw.strip)
      @origins[key] = raw.strip.match?(/\A\d+\z/) ? "$#{var}" : "$#{var}=#{raw.strip}"
      value
    rescue ConfigError => e
      raise ConfigError, e.message.sub(/\A#{key} /, "$#{var} ")
    end

    # One worker in development under a framework's development server, as Puma runs one process
    # there: Rails' development Action Cable adapter (async) broadcasts within a process, and a
    # per-process cache or an in-memory store must be the one every request sees.
    def development_workers(wanted)
      return nil unless wanted && @values[:environment] == "development"

      @origins[:workers] = "the default in development"
      1
    end

    # $WEB_CONCURRENCY: a worker count, or "auto" (as Puma 7+): Config.cpus, the CPUs this process
    # may use within its cgroup's quota, as the default.
    def workers_from_env(value)
      return Config.cpus if value == "auto"

      int(:workers, value, 1, 4096)
    rescue ConfigError
      raise ConfigError, "workers must be an integer 1..4096 or auto, got #{value.inspect}"
    end

    # restart_file: a path (relative to the app's directory, made absolute by #finalize!), or
    # false/"false"/"off" (none).
    def restart_file(key, value)
      return false if value == false || %w[false off no 0].include?(value)

      string(key, value)
    end

    # restart_file left unset: the app's tmp/restart.txt when the app's directory has a tmp/ (a Rails
    # app has one; `bin/rails restart` touches that file), else none.
    def default_restart_file
      File.directory?(File.join(app_dir, "tmp")) ? File.join(app_dir, RESTART_FILE) : false
    end

    def int(key, value, min = 0, max = nil)
      n = value.is_a?(Integer) ? value : Integer(value.to_s, 10)
      raise ArgumentError if n < min || (max && n > max)

      n
    rescue ArgumentError, TypeError
      range = max ? "#{min}..#{max}" : ">= #{min}"
      raise ConfigError, "#{key} must be an integer #{range}, got #{value.inspect}"
    end

    # zero: 0 is allowed; off: ... and means "off" (said so in the error).
    def seconds(key, value, zero: false, off: false)
      n = value.is_a?(Numeric) ? value : Float(value.to_s)
      raise ArgumentError unless (n.positive? || ((zero || off) && n.zero?)) && n.finite?

      n == n.to_i ? n.to_i : n
    rescue ArgumentError, TypeError
      what = if off then "positive number of seconds (0: off)"
             else "#{zero ? 'non-negative' : 'positive'} number of seconds"
             end
      raise ConfigError, "#{key} must be a #{what}, got #{value.inspect}"
    end

    # oob_major_gc: true only where this Ruby's GC can leave major collections to the worker (a
    # ConfigError elsewhere, as yjit without YJIT: the boot, and a HUP's --check, stop and say why).
    def major_gc(key, value)
      on = bool(key, value)
      raise ConfigError, Memory.major_gc_unsupported if on && !Memory.major_gc_control?

      on
    end

    def bool(key, value)
      case value
      when true, "true", "yes", "1", "on" then true
      when false, "false", "no", "0", "off" then false
      else raise ConfigError, "#{key} must be true or false, got #{value.inspect}"
      end
    end

    # An address String (no PROXY protocol) or a Listen -> a frozen Listen.
    def listen_entry(value)
      addr, proxy = value.is_a?(Listen) ? [value.address, value.proxy_protocol] : [value, false]
      Listen.new(address(:listen, addr), bool(:proxy_protocol, proxy)).freeze
    end

    # An address as Listeners.parse reads it, checked here (so --check, which a HUP runs before it
    # re-execs, refuses one that the boot would refuse), kept as given.
    def address(key, value)
      Listeners.parse(string(key, value), setting: key.to_s)
      value
    end

    def string(key, value)
      raise ConfigError, "#{key} must be a non-empty string, got #{value.inspect}" unless value.is_a?(String) && !value.empty?

      value
    end

    def mode(key, value)
      n = value.is_a?(Integer) ? value : Integer(value.to_s, 8)
      raise ArgumentError unless n.between?(0, 0o777)

      n
    rescue ArgumentError, TypeError
      raise ConfigError, "#{key} must be an octal file mode such as 0660, got #{value.inspect}"
    end

    # A group name ("www-data") or a numeric gid -> the gid.
    def group(key, value)
      name = value.to_s
      return int(key, name, 0, 0xFFFF_FFFE) if name.match?(/\A\d+\z/)
      unless value.is_a?(String) && !name.empty?
        raise ConfigError, "#{key} must be a group name or a numeric gid, got #{value.inspect}"
      end

      Etc.getgrnam(name).gid
    rescue ArgumentError # Etc: "can't find group for NAME"
      raise ConfigError, "#{key}: no group named #{name.inspect}"
    end

    # "URI_PREFIX=DIRECTORY" -> [prefix ending in "/", absolute directory]
    def accel_mapping(key, value)
      prefix, dir = value.is_a?(String) ? value.split("=", 2) : []
      unless prefix&.start_with?("/") && dir&.start_with?("/") && !value.include?("\0")
        raise ConfigError, "#{key} must be URI_PREFIX=DIRECTORY, both starting with /, got #{value.inspect}"
      end

      [prefix.end_with?("/") ? prefix : "#{prefix}/", dir].map(&:freeze).freeze
    end

    # refork_after 50, 100, 1000 (or "50,100,1000" from -O): positive request counts, one per generation.
    def request_steps(key, value)
      list = value.is_a?(String) ? value.split(",").map(&:strip) : Array(value)
      raise ConfigError, "#{key} must be a list of request counts (e.g. 50, 100, 1000), got #{value.inspect}" if list.empty? && !value.is_a?(Array)

      list.map { |n| int(key, n, 1) }.freeze
    end

    # "/a,/b" (-O warmup_paths=...) or an Array -> frozen paths, each absolute ("/posts?page=1"),
    # without whitespace or control characters (it becomes PATH_INFO and QUERY_STRING).
    def paths(key, value)
      list = value.is_a?(String) ? value.split(",") : Array(value)
      list.map do |path|
        unless path.is_a?(String) && path.start_with?("/") && !path.match?(/[[:space:][:cntrl:]]/)
          raise ConfigError, "#{key} must be paths starting with /, got #{path.inspect}"
        end

        path.dup.freeze
      end.freeze
    end

    def hook(key, value)
      raise ConfigError, "#{key} must be a block or a Proc" unless value.respond_to?(:call)

      value
    end

    # The config file language: `blackbuck -c config/blackbuck.rb`. Each directive is a
    # method named like the setting; hooks take a block.
    class DSL
      def initialize(config)
        @config = config
      end

      # Evaluates the file at path into config. Every error is a ConfigError that starts with
      # "path:LINE: " (the line of the file that raised), or "path: " when no line is known.
      def self.load(config, path)
        src = File.read(path)
        new(config).instance_eval(src, path, 1)
        config
      rescue Errno::ENOENT, Errno::EACCES, Errno::EISDIR => e
        raise ConfigError, "cannot read config file #{path}: #{e.message.sub(/ @ .*/, '')}"
      rescue SyntaxError => e # Ruby's message starts with "path:LINE: "
        line = ConfigError.syntax(e)
        raise ConfigError, line.start_with?("#{path}:") ? line : "#{path}: #{line}"
      rescue ConfigError => e
        raise ConfigError, "#{line_in(e, path)}: #{e.message}"
      rescue ScriptError, StandardError => e
        raise ConfigError, "#{line_in(e, path)}: #{e.class}: #{e.message}"
      end

      # "path:LINE" of the innermost frame of err's backtrace in the file being loaded, else path.
      def self.line_in(err, path)
        loc = err.backtrace_locations&.find { |l| l.path == path }
        return "#{path}:#{loc.lineno}" if loc

        line = err.backtrace&.find { |l| l.start_with?("#{path}:") }
        line ? line[/\A#{Regexp.escape(path)}:\d+/] : path
      end

      # listen "127.0.0.1:8080", "unix:/run/app.sock", proxy_protocol: true
      def listen(*addresses, proxy_protocol: false)
        addresses.each { |a| @config.set(:listen_one, Listen.new(a.to_s, proxy_protocol)) }
      end

      # refork_after 50, 100, 1000 (or one Array)
      def refork_after(*counts)
        @config.set(:refork_after, counts.size == 1 ? counts.first : counts)
      end

      # warmup "/", "/posts.json" and/or warmup { |app| ... }: run through the app in the master before
      # the first fork. Paths add up over several lines; a block replaces an earlier one.
      def warmup(*paths, &block)
        raise ConfigError, "warmup needs paths, a block, or both" if paths.empty? && !block

        @config.set(:warmup_paths, @config[:warmup_paths] + paths) unless paths.empty?
        @config.set(:warmup, block) if block
      end

      # threads 5, or Puma's `threads MIN, MAX` with both the same (Rails' config/puma.rb writes
      # `threads threads_count, threads_count`): each worker runs a fixed number of app threads.
      def threads(count, max = count)
        unless max.to_s == count.to_s
          raise ConfigError, "threads takes one count (each worker runs a fixed number of app threads; Puma's " \
                             "MIN, MAX grows from MIN to MAX), got threads #{count.inspect}, #{max.inspect}: give threads #{max.inspect}"
        end

        @config.set(:threads, count)
      end

      (DEFAULTS.keys - %i[listen config_file refork_after warmup threads] - HOOKS).each do |key|
        define_method(key) { |value| @config.set(key, value) }
      end

      HOOKS.each do |key|
        define_method(key) { |&block| @config.set(key, block) }
      end

      def method_missing(name, *)
        raise ConfigError, "unknown directive #{name}#{DSL.suggestion(name)}"
      end

      # " (did you mean workers?)" for a directive name close to one that exists, else "".
      def self.suggestion(name)
        require "did_you_mean"
        names = (DEFAULTS.keys - %i[config_file]).map(&:to_s)
        near = DidYouMean::SpellChecker.new(dictionary: names).correct(name.to_s).first
        near ? " (did you mean #{near}?)" : ""
      rescue LoadError # Ruby run with --disable-did_you_mean
        ""
      end

      def respond_to_missing?(*) = false
    end
  end
end
