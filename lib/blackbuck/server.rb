# frozen_string_literal: true

require "fcntl"
require "rack"
require_relative "memory"
require_relative "allocator"
require_relative "app_source"

module Blackbuck
  # Boots a server from a finished Config and a built app; shared by the CLI and the rack
  # handler. Listeners come from the parent (Server::Starter, systemd) when it passed any,
  # otherwise they are bound here.
  module Server
    module_function

    # source: the AppSource, the app preloaded (the rack handler's; the blackbuck command's) or
    # booted by a mold (the blackbuck command with refork_after, Refork). control: a Control (what a
    # rack handler yields) that can ask this server to stop.
    def run(config, source, logger: Logger.new($stderr, path: config[:log], debug: config[:debug]), env: ENV, control: nil)
      configure_native(config)
      Native.logger = logger # the C side warns through it (a response that cannot be spilled)
      check_spill_dir(config, logger)
      raise_open_files_limit(logger)
      # before binding: a warm-up that fails the boot leaves no listener (nor socket file) behind
      source.warm_up(logger)
      listeners = Reexec.listeners(env) # handed over by this master's previous image (HUP), flags and all
      listeners = Rebind.apply(listeners, config, logger) # ... made what the config names now
      if listeners.empty?
        listeners = Listeners.inherited(env, proxied: config[:listen].select(&:proxy_protocol).map(&:address))
      end
      listeners = bind(config) if listeners.empty?
      listeners.each do |l|
        l.io.fcntl(Fcntl::F_SETFL, l.io.fcntl(Fcntl::F_GETFL) | Fcntl::O_NONBLOCK)
        logger.info("listening on #{l.name}#{' (inherited)' if l.inherited?}#{' (PROXY protocol)' if l.proxy_protocol?}")
      end
      logger.info("Blackbuck #{VERSION} (#{config[:environment]}), #{processes_line(config)}, parser #{Native.http_impl}, " \
                  "pid #{Process.pid}#{", config #{config[:config_file]}" if config[:config_file]}")
      logger.info(timeout_line(config))
      if config[:restart_file]
        logger.info("restart file: #{config[:restart_file]} (touching it, as `bin/rails restart` does, restarts as HUP does)")
      end
      Allocator.new(env: env).boot(config, logger) # malloc and YJIT lines; the arena cap, inherited by every fork
      logger.info(Memory.describe(config[:max_memory_per_child])) if config[:max_memory_per_child].positive?
      write_pid(config[:pid])
      supervisor = Supervisor.new(config: config, source: source, listeners: listeners, logger: logger,
                                  old_workers: Reexec.old_workers(env), notify: SystemdNotify.from_env(env))
      control&.attach(supervisor)
      supervisor.run
    ensure
      control&.detach
      File.unlink(config[:pid]) if config[:pid] && File.exist?(config[:pid]) && File.read(config[:pid]).to_i == Process.pid
    end

    # The listen addresses of the config, bound; if one fails, the ones bound before it are closed.
    def bind(config)
      bound = []
      config[:listen].each do |a|
        bound.concat(Listeners.bind_all(a.address, backlog: config[:backlog], unix_mode: config[:unix_socket_mode],
                                                   unix_group: config[:unix_socket_group],
                                                   proxy_protocol: a.proxy_protocol))
      end
      bound
    rescue ConfigError
      bound.each(&:close)
      raise
    end

    # What a rack handler yields to its caller (Sinatra's `run!`, rackup): #stop (or #shutdown)
    # asks the server for a graceful stop, like TERM, from a signal trap or another thread.
    # Before the server runs, the stop waits for it; after, it does nothing.
    class Control
      def initialize
        @supervisor = nil
        @stop_asked = false
        @done = false
      end

      def attach(supervisor)
        @supervisor = supervisor
        supervisor.stop if @stop_asked
      end

      def detach
        @supervisor = nil
        @done = true
      end

      def running? = !@supervisor.nil?

      def stop
        return if @done

        @stop_asked = true
        @supervisor&.stop
        nil
      end
      alias shutdown stop
    end

    # "2 workers ($WEB_CONCURRENCY=auto) x 3 app threads ($RAILS_MAX_THREADS)": the counts, and the
    # variable each came from when the environment gave it (one app thread is not said unless so).
    def processes_line(config)
      from = ->(key) { (o = config.origin(key)) ? " (#{o})" : "" }
      threads = config[:threads]
      line = "#{Logger.count(config[:workers], 'worker')}#{from.(:workers)}"
      line += " x #{threads} app thread#{'s' if threads > 1}#{from.(:threads)}" if threads > 1 || config.origin(:threads)
      line
    end

    # Which request timeout applies (none in development unless set: a debugger's prompt).
    def timeout_line(config)
      seconds = config[:timeout]
      return "request timeout: #{seconds}s" if seconds.positive?

      "request timeout: off#{' (the default in development; set timeout to have one)' if config[:environment] == 'development'}"
    end

    # Thousands of keep-alive connections need thousands of descriptors: take the hard limit.
    def raise_open_files_limit(logger)
      soft, hard = Process.getrlimit(:NOFILE)
      return if soft >= hard

      Process.setrlimit(:NOFILE, hard, hard)
      logger.info("raised the open-files limit from #{soft} to #{hard}")
    rescue SystemCallError, NotImplementedError => e
      logger.warn("could not raise the open-files limit (#{soft}): #{e.message}")
    end

    # A $TMPDIR that cannot take spill files is said at boot (the server still starts: only slow
    # readers of large responses are affected, and they wait as if max_response_spill were 0).
    def check_spill_dir(config, logger)
      return if config[:max_response_spill].zero? || config[:max_worker_spill].zero?
      return unless (problem = Native::Conn.spill_probe)

      logger.warn("response spill files cannot be made in #{problem}; a client that stops reading " \
                  "a large response will hold its worker up to write_timeout (set TMPDIR)")
    end

    def configure_native(config)
      Rack::Utils::HTTP_STATUS_CODES.each { |code, phrase| Native.set_reason(code, phrase) }
      Native.configure(config.values)
    end

    def write_pid(path)
      return unless path

      File.write(path, "#{Process.pid}\n")
    rescue SystemCallError => e
      raise ConfigError, "cannot write pid file #{path}: #{e.message}"
    end
  end
end
