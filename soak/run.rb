# frozen_string_literal: true

# Bounded soak: one exe/blackbuck (2 workers, TCP and UNIX listeners, soak/app.ru) driven by
# loadgen/blackbuck-load in rounds that mix keep-alive and --no-keepalive, TCP and UNIX, and
# the app's routes (keep-alive, chunked streaming, request bodies, 404/500 errors). Every
# SAMPLE_EVERY seconds each worker's RSS (/proc/PID/status VmRSS) and open fds (/proc/PID/fd)
# are sampled.
#
# Warm-up: one short round of every entry of the mix (so every code path has allocated what it
# keeps: GC heap, malloc arenas, tempfile buffers), and at least the first WARMUP_FRACTION of the
# run. A 200 KB-body round, for instance, grows a worker's heap by ~30 MB once, the first time;
# measuring from before it would report that step as a leak.
#
# Verdict, over the samples after the warm-up, per worker:
#   RSS: the peak of the last third of them may exceed the peak of the first third by at most
#        RSS_GROWTH_MAX_PCT percent or RSS_GROWTH_MAX_KIB KiB, whichever is larger. Peaks, not
#        single samples: a worker's RSS swings by ~10 MB as the GC frees the 200 KB bodies, so
#        first-vs-last single samples could differ by that much without any leak; a leak
#        raises the peaks.
#   fds: sampled between rounds (no client connected), the count must never exceed the first
#        post-warm-up sample: any growth is a leak.
#   The run also fails if the server dies, a worker is replaced, or blackbuck-load reports
#   socket errors or timeouts (non-2xx answers the app gives on purpose are not errors).
#
#   SOAK_SECONDS=120 ruby soak/run.rb      (bundle exec rake soak)
# Exit status 0 = pass, 1 = fail. The server is always stopped by pid.
require "json"
require "tmpdir"
require "fileutils"
require "rbconfig"

module Soak
  ROOT = File.expand_path("..", __dir__)
  EXE = File.join(ROOT, "exe", "blackbuck")
  LOAD = File.join(ROOT, "loadgen", "blackbuck-load")
  APP = File.join(__dir__, "app.ru")

  WARMUP_FRACTION = 0.2    # the first 20% of the run is warm-up: RSS is allowed to grow there
  SAMPLE_EVERY = 5         # seconds between samples (between rounds)
  RSS_GROWTH_MAX_PCT = 10  # percent, per worker: peak of the last third vs. peak of the first third
  RSS_GROWTH_MAX_KIB = 10 * 1024 # KiB; the bound is the larger of the two
  ROUND_SECONDS = 3        # each load round
  WARMUP_ROUND_SECONDS = 1 # each round of the warm-up pass

  # [name, blackbuck-load arguments (without the URL), path, transport]
  MIX = [
    ["tcp keep-alive /hello", %w[-t1 -c20], "/hello", :tcp],
    ["unix keep-alive /hello", %w[-t1 -c20], "/hello", :unix],
    ["tcp no-keepalive /hello", %w[-t1 -c10 --no-keepalive], "/hello", :tcp],
    ["unix no-keepalive /chunked", %w[-t1 -c10 --no-keepalive], "/chunked", :unix],
    ["tcp keep-alive /chunked", %w[-t1 -c10], "/chunked", :tcp],
    ["tcp POST 200 KB /echo", ["-t1", "-c8", "-m", "POST", "--body-file", :big_body], "/echo", :tcp],
    ["unix POST 1 KB /echo", ["-t1", "-c8", "-m", "POST", "--body-file", :small_body], "/echo", :unix],
    ["tcp /error (500s)", %w[-t1 -c5], "/error", :tcp],
    ["unix /missing (404s)", %w[-t1 -c5], "/missing", :unix]
  ].freeze

  Sample = Struct.new(:t, :pid, :rss_kib, :fds)

  class Run
    def initialize(seconds)
      @seconds = seconds
      @dir = Dir.mktmpdir("bb-soak")
      @samples = []
      @totals = Hash.new { |h, k| h[k] = { requests: 0, errors: 0, non2xx: 0 } }
      @failures = []
    end

    def call
      abort "soak: #{LOAD} is missing; run bundle exec rake compile" unless File.executable?(LOAD)
      write_bodies
      start_server
      t0 = now
      next_sample = t0
      sample(0)
      MIX.each { |name, args, path, transport| load_round(name, args, path, transport, WARMUP_ROUND_SECONDS) }
      @warm_until = [now - t0, @seconds * WARMUP_FRACTION].max
      round = 0
      while now - t0 < @seconds
        if now >= next_sample
          sleep 0.3 # between rounds: let the server see the last round's connections close
          sample(now - t0)
          next_sample += SAMPLE_EVERY
        end
        name, args, path, transport = MIX[round % MIX.size]
        load_round(name, args, path, transport)
        round += 1
        check_alive
        break unless @failures.empty?
      end
      sleep 0.5 # let the last connections close
      sample(now - t0)
      report(now - t0)
      @failures.empty?
    ensure
      stop_server
      FileUtils.rm_rf(@dir)
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def write_bodies
      @bodies = { big_body: File.join(@dir, "big.bin"), small_body: File.join(@dir, "small.bin") }
      File.binwrite(@bodies[:big_body], "b" * 200_000) # above --body-buffer: spilled to a tempfile
      File.binwrite(@bodies[:small_body], "s" * 1024)
    end

    def start_server
      @log = File.join(@dir, "server.log")
      @sock = File.join(@dir, "soak.sock")
      cmd = [RbConfig.ruby, EXE, "-w", "2", "-l", "127.0.0.1:0", "-l", "unix:#{@sock}",
             "--body-buffer", "65536", "--keepalive-timeout", "5", APP]
      @pid = Process.spawn(*cmd, out: @log, err: @log, pgroup: true, chdir: ROOT)
      deadline = now + 30
      until File.read(@log).scan(/worker \d+ \(pid \d+\) ready/).size >= 2
        raise "soak: server did not start:\n#{File.read(@log)}" if now > deadline || Process.waitpid(@pid, Process::WNOHANG)

        sleep 0.1
      end
      log = File.read(@log)
      @port = Integer(log[%r{listening on http://127\.0\.0\.1:(\d+)}, 1])
      @workers = log.scan(/worker \d+ \(pid (\d+)\) ready/).flatten.map(&:to_i)
      puts "soak: server pid #{@pid}, workers #{@workers.join(', ')}, tcp 127.0.0.1:#{@port}, unix #{@sock}, " \
           "#{@seconds} s"
    end

    def load_round(name, args, path, transport, seconds = ROUND_SECONDS)
      json = File.join(@dir, "round.json")
      File.delete(json) if File.exist?(json)
      args = args.map { |a| a.is_a?(Symbol) ? @bodies.fetch(a) : a }
      target = transport == :unix ? ["-P", @sock, "http://localhost#{path}"] : ["http://127.0.0.1:#{@port}#{path}"]
      cmd = [LOAD, *args, "-d", "#{seconds}s", "--timeout", "5s", "--json", json, *target]
      out = IO.popen(cmd, err: %i[child out], &:read)
      unless $?.success? && File.exist?(json)
        @failures << "blackbuck-load failed in round #{name}: #{out.lines.last(3).join.strip}"
        return
      end
      r = JSON.parse(File.read(json))
      errors = r["errors"].slice("connect", "read", "write", "timeout").values.sum
      tot = @totals[name]
      tot[:requests] += r["requests"]
      tot[:errors] += errors
      tot[:non2xx] += r["errors"]["status"]
    end

    def check_alive
      if Process.waitpid(@pid, Process::WNOHANG)
        @failures << "the server exited: #{$?.inspect}"
        return
      end
      now_workers = File.read(@log).scan(/worker \d+ \(pid (\d+)\) ready/).flatten.map(&:to_i)
      @failures << "a worker was replaced (pids #{now_workers.join(', ')})" if now_workers != @workers
    end

    def sample(t)
      @workers.each do |pid|
        rss = File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+)/, 1].to_i
        fds = Dir.children("/proc/#{pid}/fd").size
        @samples << Sample.new(t, pid, rss, fds)
      rescue SystemCallError
        @failures << "worker #{pid} is gone"
      end
    end

    def report(elapsed)
      puts
      puts format("%8s  %8s  %10s  %5s", "t (s)", "worker", "RSS (KiB)", "fds")
      @samples.each { |s| puts format("%8.1f  %8d  %10d  %5d", s.t, s.pid, s.rss_kib, s.fds) }
      puts
      puts format("%-30s %10s %8s %8s", "round", "requests", "errors", "non-2xx")
      @totals.each { |name, v| puts format("%-30s %10d %8d %8d", name, v[:requests], v[:errors], v[:non2xx]) }
      requests = @totals.values.sum { |v| v[:requests] }
      errors = @totals.values.sum { |v| v[:errors] }
      puts format("%-30s %10d %8d %8d", "total", requests, errors, @totals.values.sum { |v| v[:non2xx] })
      puts format("%.1f s, %.0f requests/s", elapsed, requests / elapsed)
      @failures << "blackbuck-load counted #{errors} socket errors or timeouts" if errors.positive?
      judge(elapsed)
      puts
      if @failures.empty?
        puts "soak: PASS (RSS growth within max(#{RSS_GROWTH_MAX_PCT}%, #{RSS_GROWTH_MAX_KIB} KiB) per worker " \
             "after the warm-up; no fd growth)"
      else
        puts "soak: FAIL"
        @failures.each { |f| puts "  - #{f}" }
        puts File.read(@log).lines.last(20).join
      end
    end

    def judge(elapsed)
      warm = @warm_until
      puts format("warm-up: first %.1f s of %.1f s", warm, elapsed)
      @samples.group_by(&:pid).each do |pid, list|
        after = list.select { |s| s.t >= warm }
        if after.size < 3
          @failures << "worker #{pid}: fewer than 3 samples after the warm-up (run longer)"
          next
        end
        third = (after.size / 3.0).ceil
        early = after.first(third).map(&:rss_kib).max
        late = after.last(third).map(&:rss_kib).max
        growth = late - early
        bound = [early * RSS_GROWTH_MAX_PCT / 100, RSS_GROWTH_MAX_KIB].max
        fds0 = after.first.fds
        fds_max = after.map(&:fds).max
        puts format("worker %d: peak RSS first third %d KiB, last third %d KiB (%+d, bound %d); fds %d -> max %d",
                    pid, early, late, growth, bound, fds0, fds_max)
        @failures << "worker #{pid}: peak RSS grew by #{growth} KiB (bound #{bound} KiB)" if growth > bound
        @failures << "worker #{pid}: open fds grew from #{fds0} to #{fds_max} between rounds" if fds_max > fds0
      end
    end

    def stop_server
      return unless @pid

      begin
        Process.kill(:TERM, @pid)
      rescue Errno::ESRCH
        nil
      end
      deadline = now + 15
      until Process.waitpid(@pid, Process::WNOHANG)
        if now > deadline
          Process.kill(:KILL, -@pid) # the server's own process group, by pid
          Process.waitpid(@pid)
          break
        end
        sleep 0.1
      end
    rescue Errno::ECHILD, Errno::ESRCH
      nil
    end
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Integer(ENV.fetch("SOAK_SECONDS", "120"))
  abort "SOAK_SECONDS must be between 10 and 86400" unless seconds.between?(10, 86_400)
  exit(Soak::Run.new(seconds).call ? 0 : 1)
end
