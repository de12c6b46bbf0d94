# frozen_string_literal: true

require "etc"
require "socket"
require_relative "errors"

module Blackbuck
  # One listening socket: how it was named, its IO, and the env template its requests start from.
  # proxy_protocol: every connection starts with a PROXY protocol header from a load balancer,
  # which names the client (REMOTE_ADDR); a connection without a valid one is closed unanswered.
  class Listener
    attr_reader :io, :kind, :host, :port, :path, :name

    def initialize(io:, kind:, host: nil, port: nil, path: nil, inherited: false, proxy_protocol: false)
      @io = io
      @kind = kind
      @host = host
      @port = port
      @path = path
      @inherited = inherited
      @proxy_protocol = proxy_protocol
      @name = kind == :unix ? "unix:#{path}" : "http://#{host&.include?(':') ? "[#{host}]" : host}:#{port}"
    end

    def fd = @io.fileno
    def tcp? = @kind == :tcp
    def inherited? = @inherited
    def proxy_protocol? = @proxy_protocol

    # Keys every request on this listener starts with; Conn#parse dups it. Built once (a worker's
    # settings do not change). multithread: the worker runs the app on more than one thread.
    def env_template(rack_version, multithread = false)
      @env_template ||= build_env_template(rack_version, multithread)
    end

    def build_env_template(rack_version, multithread)
      server_name = tcp? ? (host.include?(":") ? "[#{host}]" : host) : "localhost"
      {
        "rack.version" => rack_version,
        "rack.url_scheme" => "http",
        "rack.errors" => $stderr,
        "rack.multithread" => multithread,
        "rack.multiprocess" => true,
        "rack.run_once" => false,
        "rack.hijack?" => true,
        "SCRIPT_NAME" => "",
        "SERVER_NAME" => server_name,
        "SERVER_PORT" => (tcp? ? port : 80).to_s,
        "SERVER_SOFTWARE" => "Blackbuck/#{VERSION}"
      }.freeze
    end

    # On shutdown: close, and remove the socket file we created (never an inherited one).
    def close
      @io.close unless @io.closed?
      File.unlink(@path) if @kind == :unix && !@inherited && File.socket?(@path)
    rescue SystemCallError, IOError
      nil
    end
  end

  # Parses listen addresses, binds them, or takes them over from a parent
  # (Server::Starter's SERVER_STARTER_PORT, systemd's LISTEN_FDS).
  module Listeners
    module_function

    ANY_HOST = "0.0.0.0" # the host of an app listener's address that names none (PORT, :PORT)

    # "HOST:PORT", ":PORT", "PORT", "[::1]:PORT", "/path.sock", "unix:/path.sock" -> [kind, host, port | path]
    # bare_host: the host of "PORT" and ":PORT" (the status listener's is loopback). setting: the
    # setting the address was given to, for the error.
    def parse(addr, bare_host: ANY_HOST, setting: "listen")
      a = addr.to_s.strip
      case a
      when %r{\Aunix:(.+)\z} then [:unix, nil, Regexp.last_match(1)]
      when %r{\A[/.~]} then [:unix, nil, File.expand_path(a)]
      when /\A\[([0-9a-fA-F:.]+)\]:(\d+)\z/ then [:tcp, Regexp.last_match(1), port!(Regexp.last_match(2), addr, setting)]
      when /\A(\d+)\z/ then [:tcp, bare_host, port!(Regexp.last_match(1), addr, setting)]
      when /\A:(\d+)\z/ then [:tcp, bare_host, port!(Regexp.last_match(1), addr, setting)]
      when /\A([^:\s\[\]]+):(\d+)\z/ then [:tcp, Regexp.last_match(1), port!(Regexp.last_match(2), addr, setting)]
      else raise ConfigError, "invalid #{setting} address #{addr.inspect} (want HOST:PORT, :PORT, PORT, [::1]:PORT or unix:/path)"
      end
    end

    def port!(str, addr, setting = "listen")
      n = Integer(str, 10)
      raise ConfigError, "invalid port in #{setting} address #{addr.inspect} (0..65535)" unless n.between?(0, 65_535)

      n
    end

    # One listener: the first address of addr that can be bound (127.0.0.1 for "localhost").
    def bind(addr, backlog:, unix_mode: nil, unix_group: nil, bare_host: ANY_HOST)
      all = bind_all(addr, backlog: backlog, unix_mode: unix_mode, unix_group: unix_group, bare_host: bare_host)
      all.drop(1).each(&:close)
      all.first
    end

    # Every listener an address names: a host name with several addresses ("localhost": 127.0.0.1
    # and ::1) gets one per address, all on the same port, as Puma does.
    def bind_all(addr, backlog:, unix_mode: nil, unix_group: nil, proxy_protocol: false, bare_host: ANY_HOST)
      kind, host, where = parse(addr, bare_host: bare_host)
      return [bind_unix(where, backlog, unix_mode, unix_group, proxy_protocol: proxy_protocol)] if kind == :unix

      ips = addresses(host, where)
      port = where
      bound = ips.filter_map do |ip|
        l = bind_tcp(Addrinfo.tcp(ip, port), host, port, backlog, optional: ips.size > 1, proxy_protocol: proxy_protocol)
        port = l.port if l # the others take the port the first one got (port 0: the kernel's pick)
        l
      end
      raise ConfigError, "cannot listen on #{host}:#{where}: none of its addresses can be bound here" if bound.empty?

      bound
    end

    LOCALHOST = %w[127.0.0.1 ::1].freeze # what "localhost" names (RFC 6761 6.3), whatever /etc/hosts says

    # The IP addresses host names, each once. "localhost" is both loopback addresses without asking the
    # resolver: many /etc/hosts lack "::1 localhost" (Debian's images, containers), which would leave
    # clients that try ::1 first (browsers, curl) refused; ::1 is skipped where the machine has no IPv6.
    def addresses(host, port)
      return LOCALHOST if host.casecmp?("localhost")

      ips = Addrinfo.getaddrinfo(host, port, nil, :STREAM, nil, Socket::AI_PASSIVE).map(&:ip_address).uniq
      raise ConfigError, "cannot resolve #{host}" if ips.empty?

      ips
    rescue SocketError => e
      raise ConfigError, "cannot resolve #{host}: #{e.message}"
    end

    # optional: an address this machine cannot have (no IPv6) is skipped (nil), not an error.
    def bind_tcp(ai, host, port, backlog, optional: false, proxy_protocol: false)
      sock = Socket.new(ai.afamily, Socket::SOCK_STREAM, 0)
      sock.setsockopt(Socket::SOL_SOCKET, Socket::SO_REUSEADDR, true)
      sock.setsockopt(Socket::IPPROTO_IPV6, Socket::IPV6_V6ONLY, true) if ai.ipv6?
      sock.bind(ai)
      sock.listen(backlog)
      Native.defer_accept(sock.fileno, 1)
      bound = sock.local_address
      Listener.new(io: sock, kind: :tcp, host: bound.ip_address, port: bound.ip_port, proxy_protocol: proxy_protocol)
    rescue Errno::EADDRNOTAVAIL, Errno::EAFNOSUPPORT => e
      sock&.close
      raise ConfigError, "cannot listen on #{host}:#{port}: #{e.message}" unless optional
    rescue SystemCallError => e
      sock&.close
      raise ConfigError, "cannot listen on #{host}:#{port}: #{e.message}"
    end

    # Mode and group are set between bind and listen: until listen(2) every connect is refused,
    # so no client (nginx) ever meets the socket with a mode or group other than the ones asked
    # for. On any error the file we bound is removed again.
    def bind_unix(path, backlog, mode, group = nil, proxy_protocol: false)
      remove_stale_socket(path)
      sock = Socket.new(:UNIX, :STREAM, 0)
      sock.bind(Socket.sockaddr_un(path))
      bound = true
      File.chmod(mode, path) if mode
      give_group(path, group) if group
      sock.listen(backlog)
      listening = Listener.new(io: sock, kind: :unix, path: path, proxy_protocol: proxy_protocol)
    rescue ArgumentError => e # path too long for sun_path
      raise ConfigError, "cannot listen on unix:#{path}: #{e.message}"
    rescue SystemCallError => e
      raise ConfigError, "cannot listen on unix:#{path}: #{e.message}"
    ensure
      unless listening
        sock&.close
        File.unlink(path) if bound && File.socket?(path)
      end
    end

    # unix_socket_group: chown(path, -1, gid); lchown, so a path swapped for a symlink is not followed.
    def give_group(path, gid)
      File.lchown(nil, gid, path)
    rescue Errno::EPERM
      name = begin
        Etc.getgrgid(gid).name
      rescue ArgumentError
        gid.to_s
      end
      raise ConfigError, "unix_socket_group: cannot give unix:#{path} to group #{name}: #{Errno::EPERM.new.message} " \
                         "(the server must run as root or as a member of #{name})"
    end

    # A socket file nobody accepts on is stale (a crashed server): replace it. One a live
    # server answers on, or a file that is not a socket, is an error.
    def remove_stale_socket(path)
      return unless File.exist?(path) || File.symlink?(path)
      raise ConfigError, "cannot listen on unix:#{path}: the file exists and is not a socket" unless File.socket?(path)

      begin
        UNIXSocket.new(path).close
        raise ConfigError, "cannot listen on unix:#{path}: another server is listening there"
      rescue Errno::ECONNREFUSED, Errno::ENOENT
        File.unlink(path) if File.socket?(path)
      end
    end

    # Listeners a parent process bound for us. Server::Starter: "0.0.0.0:8080=3;/tmp/app.sock=4".
    # systemd: LISTEN_PID == our pid, LISTEN_FDS = n, fds 3..3+n-1.
    # proxied: listen addresses with proxy_protocol (the config's); an inherited socket one of them
    # names speaks the PROXY protocol (a parent passes sockets, not how to read them).
    def inherited(env = ENV, proxied: [])
      speaks = ->(local) { proxied.any? { |addr| names?(addr, local) } }
      if (spec = env["SERVER_STARTER_PORT"])
        from_server_starter(spec, &speaks)
      elsif env["LISTEN_FDS"] && env["LISTEN_PID"].to_i == Process.pid
        (3...(3 + env["LISTEN_FDS"].to_i)).map { |fd| from_fd(fd, &speaks) }
      else
        []
      end
    end

    def from_server_starter(spec, &proxy_protocol)
      spec.split(";").reject(&:empty?).map do |pair|
        _addr, fd = pair.split("=", 2)
        raise ConfigError, "invalid SERVER_STARTER_PORT entry #{pair.inspect}" unless fd&.match?(/\A\d+\z/)

        from_fd(Integer(fd, 10), &proxy_protocol)
      end
    end

    # A block, given the socket's local Addrinfo, decides proxy_protocol instead of the argument.
    def from_fd(fd, inherited: true, proxy_protocol: false)
      sock = Socket.for_fd(fd)
      sock.autoclose = true
      addr = sock.local_address
      proxy_protocol = yield(addr) if block_given?
      if addr.unix?
        Listener.new(io: sock, kind: :unix, path: addr.unix_path, inherited: inherited, proxy_protocol: proxy_protocol)
      else
        Listener.new(io: sock, kind: :tcp, host: addr.ip_address, port: addr.ip_port, inherited: inherited,
                     proxy_protocol: proxy_protocol)
      end
    rescue SystemCallError => e
      raise ConfigError, "inherited file descriptor #{fd} is not a listening socket: #{e.message}"
    end

    # Does listen address addr ("HOST:PORT", "unix:/path", ...) name the bound socket address local
    # (an Addrinfo)? A host name names every address it resolves to.
    def names?(addr, local, bare_host: ANY_HOST)
      kind, host, where = parse(addr, bare_host: bare_host)
      return kind == :unix && File.expand_path(where) == File.expand_path(local.unix_path) if local.unix?
      return false unless kind == :tcp && where == local.ip_port

      addresses(host, where).include?(local.ip_address)
    rescue ConfigError, SocketError
      false
    end
  end
end
