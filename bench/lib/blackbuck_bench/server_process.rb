# frozen_string_literal: true

require "socket"
require "timeout"
require_relative "procfs"

module BlackbuckBench
  # One running server: spawned in its own process group, waited for (log lines + both sockets
  # accept + one correct response on each), stopped by pid (TERM, then KILL to its group).
  class ServerProcess
    BOOT_TIMEOUT_S = 40   # bundle exec + preload can be slow on a busy 2-core box
    STOP_GRACE_S = 10     # TERM, then KILL of the process group
    PROBE_TIMEOUT_S = 5

    class BootError < StandardError; end

    attr_reader :recipe, :ctx, :pid, :log_path, :probe

    # boot_timeout: seconds; more for a Rails app with 4 workers (the memory workload)
    def initialize(recipe, ctx, env, boot_timeout: BOOT_TIMEOUT_S)
      @boot_timeout = boot_timeout
      @recipe = recipe
      @ctx = ctx
      @env = env
      @log_path = File.join(ctx.dir, "server.log")
      @probe = {}
    end

    def start
      spawn
      wait_ready
    end

    # Starts the process; wait_ready then waits for it (several servers boot at once).
    def spawn
      cmd = recipe.command(ctx)
      @argv = cmd[:argv]
      File.write(File.join(ctx.dir, "command.txt"), "#{@env.slice('RUBY_YJIT_ENABLE', 'RUBY_MN_THREADS', 'LD_PRELOAD', 'RUBYOPT', 'BUNDLE_GEMFILE', 'GEM_PATH').map { |k, v| "#{k}=#{v} " }.join}#{@argv.join(' ')}\n")
      @started = monotonic
      @pid = Process.spawn(@env, *@argv, chdir: cmd[:chdir], pgroup: true, unsetenv_others: true,
                                          in: File::NULL, %i[out err] => [@log_path, "w"])
      self
    rescue SystemCallError => e
      raise BootError, "#{e.message}; log tail: #{log_tail}"
    end

    # Log lines + both sockets accept + one correct response on each; BootError otherwise.
    def wait_ready
      wait_ready!
      self
    rescue BootError, SystemCallError => e
      stop
      raise BootError, "#{e.message}; log tail: #{log_tail}"
    end

    def command_line = @argv&.join(" ")

    def alive? = @pid && !reaped?(@pid)

    # TERM to the master, without waiting: stop then waits. Stopping many servers, TERM them
    # all first, so their graceful shutdowns overlap.
    def terminate
      return unless @pid && !@term_deadline

      signal(@pid, "TERM")
      @term_deadline = monotonic + STOP_GRACE_S
    end

    def stop
      return unless @pid

      terminate
      pid = @pid
      @pid = nil
      loop do
        break if reaped?(pid)
        break signal(-pid, "KILL") if monotonic > @term_deadline

        sleep 0.05
      end
      signal(-pid, "KILL") # any worker left behind in the group (ours: we created the group)
      Process.waitpid(pid) unless reaped?(pid)
    rescue Errno::ECHILD
      nil
    end

    # The first line that names an error (a backtrace's message comes first), then the last lines.
    def log_tail(lines = 6)
      return "" unless File.exist?(@log_path)

      all = File.readlines(@log_path)
      first_error = all.find { |l| l.match?(/error|fatal|exception|emerg/i) }
      picked = ([first_error] + all.last(lines)).compact.uniq
      picked.join.strip.gsub(/\s*\n\s*/, " | ")
    end

    private

    def signal(pid, sig)
      Process.kill(sig, pid)
    rescue Errno::ESRCH, Errno::EPERM
      nil
    end

    def reaped?(pid)
      return true if @reaped&.include?(pid)

      done = !Process.waitpid(pid, Process::WNOHANG).nil?
      (@reaped ||= []) << pid if done
      done
    rescue Errno::ECHILD
      true
    end

    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def wait_ready!
      deadline = @started + @boot_timeout
      until ready?
        raise BootError, "exited during boot" unless alive?
        raise BootError, "not ready after #{@boot_timeout}s" if monotonic > deadline

        sleep 0.1
      end
      @probe = { "tcp" => http_probe { TCPSocket.new("127.0.0.1", ctx.tcp_port) },
                 "unix" => http_probe { UNIXSocket.new(ctx.unix_path) } }
      @probe["tcp"][:keepalive] = keepalive_probe { TCPSocket.new("127.0.0.1", ctx.tcp_port) }
      bad = @probe.reject { |_, p| p[:status] == 200 }
      raise BootError, "probe failed: #{bad.map { |t, p| "#{t}: #{p[:error] || p[:status_line]}" }.join('; ')}" unless bad.empty?
    end

    def ready?
      return false unless accepts?(-> { TCPSocket.new("127.0.0.1", ctx.tcp_port) }) &&
                          accepts?(-> { UNIXSocket.new(ctx.unix_path) })
      return true unless recipe.ready_re

      File.read(@log_path).scan(recipe.ready_re).size >= ctx.workers
    end

    def accepts?(connect)
      connect.call.close
      true
    rescue SystemCallError
      false
    end

    # Does the server keep an HTTP/1.1 connection open when the client does not ask to close?
    def keepalive_probe
      Timeout.timeout(PROBE_TIMEOUT_S) do
        sock = yield
        sock.write("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head = +""
        head << sock.readpartial(65_536) until head.include?("\r\n\r\n")
        sock.close
        !head.split("\r\n\r\n").first.match?(/^connection:\s*close/i)
      end
    rescue StandardError
      nil
    end

    # One GET with Connection: close; records how the server framed the body (for the report).
    def http_probe
      Timeout.timeout(PROBE_TIMEOUT_S) do
        sock = yield
        sock.write("GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        raw = sock.read
        sock.close
        head, body = raw.split("\r\n\r\n", 2)
        lines = head.to_s.split("\r\n")
        headers = lines.drop(1).to_h { |l| k, v = l.split(":", 2); [k.downcase, v.to_s.strip] }
        framing = if headers["transfer-encoding"].to_s.include?("chunked") then "chunked"
                  elsif headers["content-length"] then "content-length"
                  else "eof"
                  end
        { status: lines.first.to_s.split(" ")[1].to_i, status_line: lines.first, framing: framing,
          body_bytes: body.to_s.bytesize }
      end
    rescue StandardError => e
      { status: 0, error: "#{e.class}: #{e.message}" }
    end
  end
end
