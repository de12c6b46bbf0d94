# frozen_string_literal: true

require "optparse"
require_relative "servers"

module BlackbuckBench
  APPS = %w[hello hello_length sinatra big].freeze
  TRANSPORTS = %w[tcp unix].freeze
  MODES = %w[keepalive close].freeze

  # All defaults in one hash; --quick overrides a few of them (the flags given on the command
  # line still win over --quick).
  DEFAULTS = {
    workers: 2,            # worker processes per server (nginx: worker_processes)
    threads: 1,            # load-tool threads: on 2 cores the tool gets one, the server the rest
    connections: 50,       # concurrent connections
    duration: 5,           # seconds per measurement
    warmup: 1,             # seconds of keep-alive load after each boot, not recorded
    timeout: 5,            # per-request timeout of the load tool, seconds
    repeat: 3,             # measurements per cell, interleaved across servers
    servers: Servers.default_names,
    apps: APPS,
    transports: TRANSPORTS,
    modes: MODES,
    driver: "auto",        # blackbuck-load when built, else h2load
    crosscheck: true,      # one cell also measured with wrk (TCP) and h2load (UNIX)
    crosscheck_cell: %w[auto hello_length keepalive], # server app mode; auto = blackbuck, else unicorn
    out: File.expand_path("../../results", __dir__),
    quick: false
  }.freeze

  QUICK = { duration: 2, warmup: 0.5, repeat: 2, apps: %w[hello_length] }.freeze

  def self.parse_options(argv)
    given = {}
    list = ->(key, allowed) { ->(v) { given[key] = check_list(key, v.split(","), allowed) } }
    OptionParser.new do |o|
      o.banner = "usage: ruby bench/run.rb [options]   (see bench/README.md)"
      o.on("--quick", "CI matrix: #{QUICK.map { |k, v| "#{k}=#{Array(v).join(',')}" }.join(' ')}") { given[:quick] = true }
      o.on("--workers N", Integer, "worker processes per server (#{DEFAULTS[:workers]})") { |v| given[:workers] = positive(:workers, v) }
      o.on("--duration S", Float, "seconds per measurement (#{DEFAULTS[:duration]})") { |v| given[:duration] = positive(:duration, v) }
      o.on("--warmup S", Float, "warm-up seconds after boot (#{DEFAULTS[:warmup]})") { |v| given[:warmup] = v }
      o.on("--connections N", Integer, "connections (#{DEFAULTS[:connections]})") { |v| given[:connections] = positive(:connections, v) }
      o.on("--threads N", Integer, "load-tool threads (#{DEFAULTS[:threads]})") { |v| given[:threads] = positive(:threads, v) }
      o.on("--timeout S", Integer, "load-tool request timeout (#{DEFAULTS[:timeout]})") { |v| given[:timeout] = positive(:timeout, v) }
      o.on("--repeat N", Integer, "measurements per cell (#{DEFAULTS[:repeat]})") { |v| given[:repeat] = positive(:repeat, v) }
      o.on("--servers LIST", "#{Servers.names.join(',')}", &list.call(:servers, Servers.names))
      o.on("--apps LIST", APPS.join(","), &list.call(:apps, APPS))
      o.on("--transports LIST", TRANSPORTS.join(","), &list.call(:transports, TRANSPORTS))
      o.on("--modes LIST", MODES.join(","), &list.call(:modes, MODES))
      o.on("--driver NAME", "auto, blackbuck-load, h2load, wrk (#{DEFAULTS[:driver]})") { |v| given[:driver] = v }
      o.on("--[no-]crosscheck", "also measure one cell with wrk and h2load") { |v| given[:crosscheck] = v }
      o.on("--crosscheck-cell SERVER,APP,MODE", "default #{DEFAULTS[:crosscheck_cell].join(',')}") do |v|
        given[:crosscheck_cell] = v.split(",")
      end
      o.on("--out DIR", "where latest.{json,md,png} go") { |v| given[:out] = File.expand_path(v) }
    end.parse!(argv)
    base = DEFAULTS.dup
    base.update(QUICK) if given[:quick]
    base.update(given)
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
