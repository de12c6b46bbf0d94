# frozen_string_literal: true

require_relative "../blackbuck"

module Blackbuck
  # `rackup -s blackbuck` (Rack 3 with the rackup gem) and Rack 2's Rack::Handler.
  # Accepts Rhebok's option names (-O MaxWorkers=4) as well as snake_case ones (-O workers=4).
  module RackHandler
    RHEBOK_NAMES = {
      "Host" => :host, "Port" => :port, "Path" => :listen_one, "BackLog" => :backlog,
      "MaxWorkers" => :workers, "MaxRequestPerChild" => :max_requests_per_child,
      "MinRequestPerChild" => :min_requests_per_child, "Timeout" => :timeout, "OobGC" => :oob_gc,
      "ConfigFile" => :config_file
    }.freeze
    # rackup's own options, not ours.
    IGNORED = %i[environment config daemonize pid server Logger AccessLog debug warn include require
                 builder app_class quiet].freeze

    module_function

    def run(app, **options)
      config = Config.new
      settings = []
      options.each do |name, value|
        next if value.nil? || IGNORED.include?(name.to_sym)

        key = RHEBOK_NAMES[name.to_s] || name.to_s.downcase.to_sym
        if key == :config_file
          Config::DSL.load(config, value)
        else
          settings << [key, value]
        end
      end
      path_given = settings.any? { |k, _| k == :listen_one }
      settings.each do |key, value|
        next if path_given && %i[host port].include?(key) # Rhebok: Path= replaces Host/Port

        config.set(key == :Host ? :host : key, value.is_a?(String) || value.is_a?(Proc) ? value : value.to_s)
      end
      config.set(:environment, options[:environment].to_s) if options[:environment]
      config.finalize!
      yield config if block_given?
      Server.run(config, app)
    rescue ConfigError => e
      warn "blackbuck: #{e.message}"
      raise
    end

    def valid_options
      {
        "Host=HOST" => "host to listen on (default 0.0.0.0)",
        "Port=PORT" => "port to listen on (default 9292)",
        "Path=PATH" => "UNIX socket path (replaces Host/Port)",
        "BackLog=N" => "listen queue length",
        "MaxWorkers=N" => "worker processes",
        "MaxRequestPerChild=N" => "recycle a worker after N requests (0 = never)",
        "MinRequestPerChild=N" => "lower bound of the random recycle limit",
        "Timeout=SEC" => "request timeout",
        "OobGC=N" => "GC between requests every N requests",
        "ConfigFile=FILE" => "Blackbuck config file"
      }
    end
  end
end
