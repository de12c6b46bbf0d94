# frozen_string_literal: true

require_relative "../errors"
require_relative "../early_signals"

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
    STATUS_ENV = "BLACKBUCK_STATUS_FD"     # the status listener's fd, kept across the exec
    STANDIN_ENV = "BLACKBUCK_STATUS_STANDIN" # pid of the child answering it while the new image boots
    WORKERS_ENV = "BLACKBUCK_OLD_WORKERS" # "pid:control_fd,..."; "pid:-": told to stop already
    BOOT = File.expand_path("../reexec_boot.rb", __dir__) # what the new image loads first
    CHECK_TIMEOUT = 300                   # seconds the new code may take to boot in the check

    class << self
      # The command that started this master ([ruby, script, *argv]); set by the CLI. nil when
      # started another way (rackup): then HUP only replaces the workers.
      attr_accessor :command

      # The Ruby options the new image runs with too (YJIT and its code region: a master started
      # with `ruby --yjit` must not come back without it); set by the CLI.
      attr_writer :ruby_options

      def ruby_options = @ruby_options || []
    end

    module_function

    def available? = !command.nil?

    # The JIT options of a command line [ruby, *options, script, *argv] (Allocator.command): only
    # those, as the new image loads itself differently (--disable-gems, its boot file first).
    def jit_options(cmdline) = cmdline.grep(/\A--(yjit|mjit|jit)(\z|[-=])/)

    # Boots the new code without serving. nil when it booted, else the last line it printed.
    # Yields the seconds to wait before it looks again: the master keeps its watchdog fed and its
    # status listener answered meanwhile.
    def check
      ruby, script, *args = command
      r, w = IO.pipe
      pid = Process.spawn(ruby, *ruby_options, script, "--check", *args, out: w, err: w, in: File::NULL)
      w.close
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + CHECK_TIMEOUT
      status = nil
      until (status = Process.wait2(pid, Process::WNOHANG)&.last)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          Process.kill(:KILL, pid)
          Process.wait(pid)
          return "the new code did not boot within #{CHECK_TIMEOUT}s"
        end
        block_given? ? yield(0.05) : sleep(0.05)
      end
      out = r.read
      status.success? ? nil : (out.lines.last&.strip || "exited with #{status.exitstatus}")
    ensure
      r&.close
    end

    # old_workers: [[pid, control IO or nil], ...] (nil: told to stop already, only to be reaped);
    # pending: signals queued here and not acted on, for the new image (EarlySignals);
    # env: more variables for the new image (the systemd notify socket the master took).
    # The new image loads reexec_boot.rb before anything else, so its traps are set within
    # milliseconds; until then the master's signals are ignored (#ignore_signals), never fatal.
    # status: the status listener (Listener or nil), kept open for the new image (#status_listener).
    def exec!(listeners, old_workers, pending: [], status: nil, env: {})
      keep = {}
      keep[status.fd] = status.fd if status
      listen = listeners.map do |l|
        keep[l.fd] = l.fd
        "#{l.fd}:#{l.inherited? ? 'i' : 'o'}#{':p' if l.proxy_protocol?}"
      end
      workers = old_workers.map do |pid, control|
        next "#{pid}:-" if control.nil? || control.closed?

        keep[control.fileno] = control.fileno
        "#{pid}:#{control.fileno}"
      end
      ruby, *rest = command
      vars = env.merge(LISTEN_ENV => listen.join(","), WORKERS_ENV => workers.join(","),
                       EarlySignals::PENDING_ENV => EarlySignals.encode(pending),
                       STATUS_ENV => status&.fd&.to_s)
      Kernel.exec(vars, ruby, *ruby_options, "--disable-gems", "-r#{BOOT}", *rest, keep)
    end

    # Right before #exec!: the master's signals are ignored from here until the new image traps
    # them. exec resets a caught signal to its default action, which for HUP, TERM, INT, QUIT and
    # USR1 ends the process (TTIN and TTOU stop it), while an ignored one stays ignored. (Blocking
    # them would not do: Ruby empties the signal mask as it starts.) A trap whose signal came just
    # before runs now, so its signal is in the queue the caller hands over.
    def ignore_signals
      EarlySignals::NAMES.each { |sig| trap(sig, "IGNORE") }
      sleep 0.001
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

    # In the new image: the status listener the previous one kept open (a Listener it bound), or nil.
    def status_listener(env = ENV)
      fd = env.delete(STATUS_ENV)
      fd.nil? || fd.empty? ? nil : Listeners.from_fd(Integer(fd), inherited: false)
    end

    # In the new image: [[pid, control IO or nil], ...] of the previous images' workers (nil: a
    # worker told to stop before this exec, still finishing).
    def old_workers(env = ENV)
      spec = env.delete(WORKERS_ENV)
      return [] if spec.nil? || spec.empty?

      spec.split(",").map do |pair|
        pid, fd = pair.split(":")
        [Integer(pid), fd == "-" ? nil : IO.for_fd(Integer(fd), autoclose: true)]
      end
    end
  end
end
