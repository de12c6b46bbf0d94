# frozen_string_literal: true

require "etc"
require_relative "errors"
require_relative "listeners"

module Blackbuck
  # HUP with a changed config file: the new image serves the listen addresses the config names now
  # (Unicorn rebinds on HUP too). It keeps the sockets the previous image handed over that the
  # config still names (their queued connections and their port stay), binds the addresses it
  # added, closes those it dropped, and gives kept UNIX sockets the unix_socket_mode and
  # unix_socket_group it asks for. Each change is one log line; what cannot be applied is a
  # warning and the previous listeners keep serving, so a reload never leaves the server deaf.
  #
  # Sockets a parent passed (Server::Starter, systemd) are the parent's to change: they are kept
  # as they are, and a listen list that names others is a warning.
  class Rebind
    def self.apply(handed, config, logger) = new(handed, config, logger).apply

    def initialize(handed, config, logger)
      @handed = handed
      @config = config
      @logger = logger
    end

    # -> the listeners to serve
    def apply
      return @handed if @handed.empty?
      return from_parent if @handed.any?(&:inherited?)

      wanted = @config[:listen]
      kept = @handed.select { |l| wanted.any? { |w| names?(w.address, l) } }
      dropped = @handed - kept
      added = []
      failed = []
      wanted.each do |w|
        next if @handed.any? { |l| names?(w.address, l) }

        begin
          added.concat(Listeners.bind_all(w.address, backlog: @config[:backlog], unix_mode: @config[:unix_socket_mode],
                                                     unix_group: @config[:unix_socket_group],
                                                     proxy_protocol: w.proxy_protocol))
        rescue ConfigError => e
          failed << "#{w.address} (#{e.message})"
        end
      end
      if failed.any?
        @logger.warn("HUP: cannot listen on #{failed.join(', ')}; keeping every previous listener " \
                     "(#{@handed.map(&:name).join(' ')}) until it can")
        return @handed + added.each { |l| @logger.info("HUP: added listener #{l.name}") }
      end
      dropped.each do |l|
        l.close
        @logger.info("HUP: closed listener #{l.name} (no longer in the config)")
      end
      added.each { |l| @logger.info("HUP: added listener #{l.name}") }
      kept = kept.map { |l| with_proxy_flag(l, wanted) }
      kept.each { |l| apply_unix_permissions(l) if l.kind == :unix }
      kept + added
    end

    private

    # Does listen address addr name the handed-over listener? A port of 0 (the kernel's pick) names
    # whatever port the listener got on that host.
    def names?(addr, listener)
      kind, host, where = Listeners.parse(addr)
      return kind == :unix && File.expand_path(where) == File.expand_path(listener.path) if listener.kind == :unix
      return false unless kind == :tcp

      local = listener.io.local_address
      return Listeners.names?(addr, local) unless where.zero?

      Listeners.addresses(host, 0).include?(local.ip_address)
    rescue ConfigError, SocketError, SystemCallError
      false
    end

    # The config may turn the PROXY protocol on or off for an address it keeps.
    def with_proxy_flag(listener, wanted)
      entry = wanted.find { |w| names?(w.address, listener) }
      return listener if entry.nil? || entry.proxy_protocol == listener.proxy_protocol?

      @logger.info("HUP: #{listener.name} #{entry.proxy_protocol ? 'now expects' : 'no longer expects'} a PROXY protocol header")
      Listener.new(io: listener.io, kind: listener.kind, host: listener.host, port: listener.port, path: listener.path,
                   proxy_protocol: entry.proxy_protocol)
    end

    # unix_socket_mode and unix_socket_group, applied to a socket file the previous image made
    # (a setting removed from the config leaves the file as it is).
    def apply_unix_permissions(listener)
      path = listener.path
      stat = File.lstat(path)
      mode = @config[:unix_socket_mode]
      if mode && stat.mode & 0o7777 != mode
        File.chmod(mode, path)
        @logger.info(format("HUP: %<name>s mode %<new>04o (was %<old>04o)", name: listener.name, new: mode, old: stat.mode & 0o7777))
      end
      group = @config[:unix_socket_group]
      return unless group && stat.gid != group

      Listeners.give_group(path, group)
      @logger.info("HUP: #{listener.name} group #{group_name(group)} (was #{group_name(stat.gid)})")
    rescue ConfigError, SystemCallError => e
      @logger.warn("HUP: cannot change #{listener.name}: #{e.message}")
    end

    def group_name(gid)
      Etc.getgrgid(gid).name
    rescue ArgumentError
      gid.to_s
    end

    # A parent's sockets are the parent's (the config's listen was not bound at boot either).
    def from_parent
      @logger.info("HUP: the listeners come from the parent process (Server::Starter or systemd); " \
                   "listen changes in the config are not applied") if @config[:config_file]
      @handed
    end
  end
end
