# frozen_string_literal: true

require "socket"

module BlackbuckBench
  # What the runner and the memory workload both ask of this machine: the monotonic clock and a
  # free TCP port on 127.0.0.1 for a server to bind.
  module Local
    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def free_port
      s = TCPServer.new("127.0.0.1", 0)
      s.addr[1]
    ensure
      s&.close
    end
  end
end
