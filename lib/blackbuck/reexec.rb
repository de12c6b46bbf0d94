# frozen_string_literal: true

require_relative "errors"

module Blackbuck
  # HUP: new code and gems under the same master pid (so it works under systemd and as PID 1).
  #
  # 1. The master boots the new code in a separate `blackbuck --check ...` process. If that
  #    fails, the error is logged and the running workers keep serving: no outage.
  # 2. Otherwise the master execs itself with the same command line, keeping the listening
  #    sockets and the old workers' control pipes open, and names them in the environment.
  # 3. The new image inherits the listeners (never re-binds), loads the app, forks new
  #    workers, and when they are ready tells the old workers (still its children) to finish
  #    their requests and exit.
  module Reexec
    LISTEN_ENV = "BLACKBUCK_LISTEN_FDS"   # "fd:o,fd:i:p": o = a socket we bound, i = one a parent gave us;
                                          # a third field "p" = it speaks the PROXY protocol (images
                                          # before it read the first two fields only)
    WORKERS_ENV = "BLACKBUCK_OLD_WORKERS" # "pid:control_fd,..."
    CHECK_TIMEOUT = 300                   # seconds the new code may take to boot in the check

    class << self
      # The command that started this master ([ruby, script, *argv]); set by the CLI. nil when
      # started another way (rackup): then HUP only replaces the workers.
      attr_accessor :command
    end

    module_function

    def available? = !command.nil?

    # Boots the new code without serving. nil when it booted, else the last line it printed.
    # Yields while it waits (the master keeps its watchdog fed).
    def check
      ruby, script, *args = command
      r, w = IO.pipe
      pid = Process.spawn(ruby, script, "--check", *args, out: w, err: w, in: File::NULL)
      w.close
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + CHECK_TIMEOUT
      status = nil
      until (status = Process.wait2(pid, Process::WNOHANG)&.last)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          Process.kill(:KILL, pid)
          Process.wait(pid)
          return "the new code did not boot within #{CHECK_TIMEOUT}s"
        end
        yield if block_given?
        sleep 0.05
      end
      out = r.read
      status.success? ? nil : (out.lines.last&.strip || "exited with #{status.exitstatus}")
    ensure
      r&.close
    end

    # env: more variables for the new image (the systemd notify socket the master took).
    def exec!(listeners, old_workers, env: {})
      keep = {}
      listen = listeners.map do |l|
        keep[l.fd] = l.fd
        "#{l.fd}:#{l.inherited? ? 'i' : 'o'}#{':p' if l.proxy_protocol?}"
      end
      workers = old_workers.map do |pid, control|
        keep[control.fileno] = control.fileno
        "#{pid}:#{control.fileno}"
      end
      Kernel.exec(env.merge(LISTEN_ENV => listen.join(","), WORKERS_ENV => workers.join(",")), *command, keep)
    end

    # In the new image: the listeners the previous one handed over ([] when none).
    def listeners(env = ENV)
      spec = env.delete(LISTEN_ENV)
      return [] if spec.nil? || spec.empty?

      spec.split(",").map do |pair|
        fd, whose, flags = pair.split(":")
        Listeners.from_fd(Integer(fd), inherited: whose == "i", proxy_protocol: flags.to_s.include?("p"))
      end
    end

    # In the new image: [[pid, control IO], ...] of the previous image's workers.
    def old_workers(env = ENV)
      spec = env.delete(WORKERS_ENV)
      return [] if spec.nil? || spec.empty?

      spec.split(",").map do |pair|
        pid, fd = pair.split(":").map { |x| Integer(x) }
        [pid, IO.for_fd(fd, autoclose: true)]
      end
    end
  end
end
