# frozen_string_literal: true

require "socket"

module Blackbuck
  # sd_notify(3) without libsystemd: datagrams of "KEY=VALUE" lines to $NOTIFY_SOCKET (a path, or
  # "@name" for an abstract socket) for a Type=notify (or notify-reload) unit. The master says
  # READY=1 once all its workers are up, RELOADING=1 around a HUP re-exec (the same pid says READY=1
  # again), STOPPING=1 when it starts to stop, STATUS= a line systemctl status shows, and WATCHDOG=1
  # every half of $WATCHDOG_USEC while its loop turns. A send that fails is dropped: systemd is
  # never allowed to stop the server.
  class SystemdNotify
    ENV_SOCKET = "NOTIFY_SOCKET"

    # nil without $NOTIFY_SOCKET. The variable is removed from env so workers and the app do not
    # speak for the master; #env_for_exec hands it to the next image at a HUP re-exec.
    def self.from_env(env = ENV)
      path = env.delete(ENV_SOCKET)
      return nil if path.nil? || path.empty?

      new(path, watchdog_usec: env["WATCHDOG_USEC"], watchdog_pid: env["WATCHDOG_PID"])
    end

    attr_reader :path

    def initialize(path, watchdog_usec: nil, watchdog_pid: nil)
      @path = path
      @address = Socket.sockaddr_un(path.start_with?("@") ? "\0#{path[1..]}" : path)
      @socket = Socket.new(:UNIX, :DGRAM, 0)
      usec = watchdog_usec.to_i
      mine = watchdog_pid.nil? || watchdog_pid.to_i == Process.pid
      @watchdog_interval = usec.positive? && mine ? usec / 2_000_000.0 : nil
    end

    # Seconds between WATCHDOG=1 messages, or nil when systemd watches nothing.
    attr_reader :watchdog_interval

    def ready(status) = send_state("READY=1", "MAINPID=#{Process.pid}", "STATUS=#{status}")
    def reloading = send_state("RELOADING=1", "MONOTONIC_USEC=#{Process.clock_gettime(Process::CLOCK_MONOTONIC, :microsecond)}")
    def stopping(status) = send_state("STOPPING=1", "STATUS=#{status}")
    def status(text) = send_state("STATUS=#{text}")
    def watchdog = send_state("WATCHDOG=1")

    def env_for_exec = { ENV_SOCKET => @path }

    def close = @socket.close

    private

    def send_state(*lines)
      @socket.sendmsg_nonblock("#{lines.join("\n")}\n", 0, @address, exception: false)
    rescue SystemCallError, IOError
      nil
    end
  end
end
