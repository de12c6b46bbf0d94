# frozen_string_literal: true

require "fcntl"
require "rack"

module Blackbuck
  # Boots a server from a finished Config and a built app; shared by the CLI and the rack
  # handler. Listeners come from the parent (Server::Starter, systemd) when it passed any,
  # otherwise they are bound here.
  module Server
    module_function

    def run(config, app, logger: Logger.new($stderr, path: config[:log]), env: ENV)
      configure_native(config)
      Native.logger = logger # the C side warns through it (a response that cannot be spilled)
      check_spill_dir(config, logger)
      raise_open_files_limit(logger)
      listeners = Reexec.listeners(env) # handed over by this master's previous image (HUP)
      listeners = Listeners.inherited(env) if listeners.empty?
      if listeners.empty?
        listeners = config[:listen].map do |a|
          Listeners.bind(a, backlog: config[:backlog], unix_mode: config[:unix_socket_mode],
                            unix_group: config[:unix_socket_group])
        end
      end
      listeners.each do |l|
        l.io.fcntl(Fcntl::F_SETFL, l.io.fcntl(Fcntl::F_GETFL) | Fcntl::O_NONBLOCK)
        logger.info("listening on #{l.name}#{' (inherited)' if l.inherited?}")
      end
      logger.info("Blackbuck #{VERSION} (#{config[:environment]}), #{config[:workers]} workers, " \
                  "parser #{Native.http_impl}, pid #{Process.pid}")
      write_pid(config[:pid])
      Supervisor.new(config: config, app: app, listeners: listeners, logger: logger,
                     old_workers: Reexec.old_workers(env)).run
    ensure
      File.unlink(config[:pid]) if config[:pid] && File.exist?(config[:pid]) && File.read(config[:pid]).to_i == Process.pid
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
      Native.configure(config[:max_request_line], config[:max_uri], config[:max_headers],
                       config[:max_header_bytes], (config[:write_timeout] * 1000).to_i,
                       config[:response_buffer], config[:max_response_spill], config[:max_worker_spill])
    end

    def write_pid(path)
      return unless path

      File.write(path, "#{Process.pid}\n")
    rescue SystemCallError => e
      raise ConfigError, "cannot write pid file #{path}: #{e.message}"
    end
  end
end
