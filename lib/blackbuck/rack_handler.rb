# frozen_string_literal: true

require_relative "../blackbuck"

module Blackbuck
  # `rackup -s blackbuck` and `rails server -u blackbuck` (Rack 3 with the rackup gem, and Rack 2's
  # Rack::Handler), and Sinatra's `set :server, "blackbuck"`. Accepts Rhebok's option names
  # (-O MaxWorkers=4) and the settings' own (-O workers=4); reads config/blackbuck.rb when present
  # (-O ConfigFile=FILE names another). Yields a Server::Control (#stop, #shutdown) to the caller.
  module RackHandler
    RHEBOK_NAMES = {
      "Host" => :host, "Port" => :port, "Path" => :listen_one, "BackLog" => :backlog,
      "MaxWorkers" => :workers, "MaxRequestPerChild" => :max_requests_per_child,
      "MinRequestPerChild" => :min_requests_per_child, "Timeout" => :timeout, "OobGC" => :oob_gc,
      "ConfigFile" => :config_file
    }.freeze
    # Options rackup and Rails pass that are theirs, not ours (rackup has already daemonized,
    # written the pid file and loaded config.ru; Rails handles its log, caching and restarts).
    # Logged at debug level. Rails' `--early-hints` arrives as early_hints: true, the setting's own
    # name (nil when not given, so the config file's early_hints stands).
    IGNORED = %i[environment config daemonize pid server Logger AccessLog debug warn include require builder
                 app_class quiet user_supplied_options log_stdout caching restart_cmd
                 DoNotReverseLookup].freeze
    ADDRESS = %i[host port].freeze

    module_function

    def run(app, **options)
      config = Config.new
      file = options[:ConfigFile] || options[:config_file] || (Config::DEFAULT_FILE if File.file?(Config::DEFAULT_FILE))
      if file
        Config::DSL.load(config, file)
        config.set(:config_file, file)
      end
      settings, ignored, unknown = sort(options)
      apply(config, settings, options[:user_supplied_options])
      config.set(:environment, options[:environment].to_s) if options[:environment]
      config.set(:debug, true) if options[:debug]
      config.finalize!(ENV, one_in_development: true) # one process in development, as Puma
      why = config[:solid_queue] && Jobs.missing(config)
      raise ConfigError, why if why

      logger = Logger.new($stderr, path: config[:log], debug: config[:debug])
      ignored.each { |name| logger.debug("option #{name} ignored: rackup's or Rails' own, not a Blackbuck setting") }
      unknown.each do |name|
        logger.warn("ignoring unknown option #{name}=#{options[name].inspect} (settings: docs/CONFIGURATION.md)")
      end
      RequestTimeout.register_with_rails # (rails server: the app is loaded)
      control = Server::Control.new
      yield control if block_given?
      Server.run(config, AppSource.preloaded(app, config), logger: logger, control: control)
    rescue ConfigError => e
      # One line and a non-zero exit, as from the blackbuck command (not the caller's backtrace).
      warn Logger.entry_text("blackbuck: #{e.message}")
      exit 1
    end

    # options -> [[[setting, value], ...], ignored names, unknown names]
    def sort(options)
      settings = []
      ignored = []
      unknown = []
      options.each do |name, value|
        next if value.nil? || %i[ConfigFile config_file].include?(name.to_sym)

        if IGNORED.include?(name.to_sym)
          ignored << name
          next
        end
        key = RHEBOK_NAMES[name.to_s] || name.to_s.downcase.to_sym
        if key == :listen_one || Config.setting?(key)
          settings << [key, value]
        else
          unknown << name
        end
      end
      [settings, ignored, unknown]
    end

    # Where the address comes from. Rhebok's Path= replaces Host/Port. Rails passes its default
    # Host and Port (localhost:3000) whether the user gave them or not, and names the ones the
    # user gave (-b, -p, $PORT) in user_supplied_options: those replace the config file's
    # listeners (as `port` does in config/puma.rb); Rails' defaults and rackup's (which says
    # nothing about what the user gave) apply only when the config file names no address.
    def apply(config, settings, user_supplied)
      path_given = settings.any? { |k, _| k == :listen_one }
      file_address = !config[:listen].empty? || !config[:port].nil? || config[:host] != Config::DEFAULTS[:host]
      given = user_supplied&.map(&:to_s)
      use_address = !path_given && (given ? given.intersect?(%w[Host Port]) || !file_address : !file_address)
      config.set(:listen, []) if use_address && given&.intersect?(%w[Host Port])
      settings.each do |key, value|
        next if ADDRESS.include?(key) && !use_address

        config.set(key, value.is_a?(String) || value.is_a?(Proc) ? value : value.to_s)
      end
    end

    def valid_options
      {
        "Host=HOST" => "host to listen on (default #{Config::DEFAULTS[:host]})",
        "Port=PORT" => "port to listen on (default #{Config::DEFAULT_PORT})",
        "Path=PATH" => "UNIX socket path (replaces Host/Port)",
        "BackLog=N" => "listen queue length",
        "MaxWorkers=N" => "worker processes (default $WEB_CONCURRENCY, else 1 in development, else the CPU count)",
        "MaxRequestPerChild=N" => "recycle a worker after N requests (0 = never)",
        "MinRequestPerChild=N" => "lower bound of the random recycle limit",
        "Timeout=SEC" => "request timeout",
        "OobGC=N" => "GC between requests every N requests",
        "ConfigFile=FILE" => "Blackbuck config file (default config/blackbuck.rb when present)",
        "NAME=VALUE" => "any setting of docs/CONFIGURATION.md, e.g. workers=4 keepalive_timeout=65"
      }
    end
  end
end
