# frozen_string_literal: true

require "socket"

module BlackbuckBench
  # What the runner and the memory workload both ask of this machine: the monotonic clock and a
  # free TCP port on 127.0.0.1 for a server to bind.
  module Local
    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    PORT_SPAN = 12_000 # ports below the kernel's ephemeral range the harness picks from
    PORT_TRIES = 200

    # A port no server holds, below the kernel's ephemeral range (ip_local_port_range): the load
    # generators' connect(2)s and other programs' bind(0)s never take one of those, so it is still
    # free when the server binds it a moment later. A port bind(0) gave, closed again, was not: a
    # CI run beside another lost a Puma boot to EADDRINUSE. Where the range cannot be read, bind(0).
    def free_port
      low = ephemeral_low
      return any_port unless low && low > PORT_SPAN + 1024

      PORT_TRIES.times do
        port = rand((low - PORT_SPAN)...low)
        TCPServer.new("127.0.0.1", port).close
        return port
      rescue Errno::EADDRINUSE, Errno::EACCES
        next
      end
      any_port
    end

    private

    def ephemeral_low
      Integer(File.read("/proc/sys/net/ipv4/ip_local_port_range").split.first, 10)
    rescue SystemCallError, ArgumentError, TypeError
      nil
    end

    def any_port
      s = TCPServer.new("127.0.0.1", 0)
      s.addr[1]
    ensure
      s&.close
    end
  end
end
