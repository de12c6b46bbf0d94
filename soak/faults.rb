# frozen_string_literal: true

# The fault soak (issue 32): a client that never retries and accounts for every request
# (test/support/fault_load.rb), under mixed keep-alive, connection-per-request, upload and slow
# download load over TCP and a UNIX socket, against exe/blackbuck with reforking on, a HUP every
# HUP_EVERY seconds and a serving worker SIGKILLed every KILL_EVERY seconds; run once by default
# and once with --threads 4 (SOAK_MODES).
#
# Verdict: only what was in flight on a SIGKILLed worker may be lost. A lost request is put down to
# a kill when the killed worker was answering it (its head came, with x-worker-pid, before it broke
# off) or, without a head, answered the request before it on the same connection (the connection
# was that worker's); or when the kill fell between its sending (on a connection that had served
# before, the sending of the request before it: a connection may move to another worker meanwhile)
# and its failure, since whose it was is not always known (the first request of a connection, a
# connection moved). Anything else lost fails
# the run; each lost request is printed with its reason.
#
#   SOAK_SECONDS=600 ruby soak/faults.rb    (bundle exec rake soak:faults; per mode)
#   SOAK_HUP_EVERY=120 SOAK_KILL_EVERY=60 SOAK_MODES=1,4
# Exit status 0 = nothing lost but to kills, 1 = otherwise. The server is always stopped by pid.
require "tmpdir"
require "fileutils"
require "rbconfig"
require_relative "../test/support/fault_load"

module FaultSoak
  ROOT = File.expand_path("..", __dir__)
  EXE = File.join(ROOT, "exe", "blackbuck")
  APP = File.join(__dir__, "faults_app.ru")

  WORKERS = 3
  # Requests a worker of each generation serves before it forks the next one's mold: a first refork
  # soon, then one about every half minute at the rate this machine serves the mix (~4,000 a second
  # per worker), for 10 minutes and more.
  REFORK_AFTER = [2_000, *Array.new(40, 100_000)].freeze
  DOWNLOAD_BYTES = 10 * 1024 * 1024 # a slow reader's download
  DOWNLOAD_RATE = 2_000_000         # bytes a second it is read at
  UPLOAD_BYTES = 200_000            # an upload's body (past body_buffer: spilled to a tempfile)
  BOOT_SECONDS = 60                 # the server has this long to start, and to stop
  TAIL_SECONDS = 60                 # the load may outlive the run by this much (its last answers)
  KILL_SETTLE_SECONDS = 0.2         # a SIGKILL takes effect after kill(2) returns (the kernel stops the
                                    # worker, then closes its sockets): a request sent this long after
                                    # may still have been accepted by it

  # A request lost, and why.
  Loss = Struct.new(:client, :outcome, :detail, :sent_at, :failed_at, :pid, :killed_by)
  MOVABLE = %i[eof_reused].freeze # losses before any byte on a connection that served before: it may have moved

  class Run
    def initialize(threads, seconds:, hup_every:, kill_every:)
      @threads = threads
      @seconds = seconds
      @hup_every = hup_every
      @kill_every = kill_every
      @dir = Dir.mktmpdir("bb-fault-soak")
      @kills = [] # [pid, just before the kill, just after it]
      @hups = 0
      @problems = []
    end

    # true when nothing was lost but to kills
    def call
      start_server
      load = FaultLoad.new(clients, max_seconds: @seconds + TAIL_SECONDS)
      @t0 = now
      next_hup = @t0 + @hup_every
      next_kill = @t0 + @kill_every
      while now - @t0 < @seconds
        sleep 0.2
        if server_gone?
          @problems << "the master exited: #{@status.inspect}"
          break
        end
        if now >= next_kill
          kill_a_worker
          next_kill += @kill_every
        end
        if now >= next_hup
          Process.kill(:HUP, @pid)
          @hups += 1
          next_hup += @hup_every
        end
      end
      load.stop
      report(load)
    ensure
      stop_server
      FileUtils.rm_rf(@dir)
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def clients
      tcp = -> { TCPSocket.new("127.0.0.1", @port) }
      unix = -> { UNIXSocket.new(@sock) }
      upload = ("u" * UPLOAD_BYTES).freeze
      download = "/download?bytes=#{DOWNLOAD_BYTES}"
      [*Array.new(3) { |i| ["tcp-keepalive-#{i}", tcp, true, "/"] },
       *Array.new(3) { |i| ["unix-keepalive-#{i}", unix, true, "/"] },
       *Array.new(2) { |i| ["tcp-per-request-#{i}", tcp, false, "/"] },
       ["unix-per-request", unix, false, "/"],
       ["tcp-upload", tcp, true, "/echo", nil, upload],
       ["unix-upload-per-request", unix, false, "/echo", nil, upload],
       ["tcp-download", tcp, true, download, DOWNLOAD_RATE],
       ["unix-download", unix, true, download, DOWNLOAD_RATE]]
    end

    def start_server
      @log = File.join(@dir, "server.log")
      @sock = File.join(@dir, "soak.sock")
      config = File.join(@dir, "blackbuck.rb")
      File.write(config, "refork_after #{REFORK_AFTER.join(', ')}\n")
      cmd = [RbConfig.ruby, EXE, "-c", config, "-w", WORKERS.to_s, "--threads", @threads.to_s,
             "-l", "127.0.0.1:0", "-l", "unix:#{@sock}", "--body-buffer", "65536", APP]
      @pid = Process.spawn(*cmd, out: @log, err: @log, pgroup: true, chdir: ROOT)
      deadline = now + BOOT_SECONDS
      until File.read(@log).scan(/worker \d+ \(pid \d+\) ready/).size >= WORKERS
        raise "fault soak: the server did not start:\n#{File.read(@log)}" if now > deadline || server_gone?

        sleep 0.1
      end
      @port = Integer(File.read(@log)[%r{listening on http://127\.0\.0\.1:(\d+)}, 1])
      puts "fault soak, --threads #{@threads}: server pid #{@pid}, tcp 127.0.0.1:#{@port}, unix #{@sock}, " \
           "#{@seconds} s, HUP every #{@hup_every} s, a worker SIGKILLed every #{@kill_every} s, " \
           "refork_after #{REFORK_AFTER.first}, then #{REFORK_AFTER.last} (#{REFORK_AFTER.size} generations)"
    end

    # A worker that serves (not stopping, not a mold): one of the master's children, by its title.
    def kill_a_worker
      pids = File.read("/proc/#{@pid}/task/#{@pid}/children").split.map(&:to_i)
      serving = pids.select do |pid|
        File.read("/proc/#{pid}/cmdline").match?(/\Ablackbuck worker \d+ requests/)
      rescue SystemCallError
        false
      end
      return if serving.empty?

      victim = serving.sample
      before = now
      Process.kill(:KILL, victim)
      @kills << [victim, before, now]
    rescue SystemCallError
      nil
    end

    def server_gone?
      return true if @status

      pid, @status = Process.waitpid2(@pid, Process::WNOHANG)
      !pid.nil?
    end

    def losses(load)
      load.results.flat_map do |outcome, list|
        list.map do |client, detail, sent_at, failed_at, pid, previous|
          since = MOVABLE.include?(outcome) && previous ? previous : sent_at
          Loss.new(client, outcome, detail, sent_at, failed_at, pid, killed_by(since, failed_at, pid))
        end
      end
    end

    # The kill a loss is put down to, or nil: the killed worker answered it, or its connection was that
    # worker's (the answer before it came from there), or the kill came while it was on its way.
    def killed_by(since, failed_at, pid)
      @kills.find do |victim, before, after|
        before <= failed_at && (victim == pid || since <= after + KILL_SETTLE_SECONDS)
      end
    end

    def report(load)
      lost = losses(load).sort_by(&:failed_at)
      unexplained = lost.reject(&:killed_by)
      reforks = File.read(@log).scan(/forks the mold after/).size
      puts format("fault soak, --threads %d: %.0f s, %d HUPs, %d reforks, %d workers SIGKILLed (%s)", @threads, now - @t0,
                  @hups, reforks, @kills.size, @kills.map(&:first).join(", "))
      puts format("  sent %d, ok %d, lost %d (%d on a SIGKILLed worker, %d otherwise)", load.sent, load.ok, lost.size,
                  lost.size - unexplained.size, unexplained.size)
      lost.each do |l|
        why = l.killed_by ? "SIGKILL of worker #{l.killed_by[0]} at #{format('%.1f', l.killed_by[1] - @t0)} s" : "NOT a SIGKILL"
        puts format("  lost: %-24s %-10s %-32s sent at %7.1f s, failed at %7.1f s, worker %s: %s",
                    l.client, l.outcome, l.detail.to_s, l.sent_at - @t0, l.failed_at - @t0, l.pid || "?", why)
      end
      @problems << "#{unexplained.size} requests lost that were not on a SIGKILLed worker" if unexplained.any?
      @problems << "no request was answered" if load.ok.zero?
      @problems.each { |p| puts "  FAIL: #{p}" }
      puts File.read(@log).lines.grep(/ERROR|WARN/).last(20).join if @problems.any?
      @problems.empty?
    end

    def stop_server
      return unless @pid && !server_gone?

      Process.kill(:TERM, @pid)
      deadline = now + BOOT_SECONDS
      sleep 0.1 until server_gone? || now > deadline
      return if server_gone?

      Process.kill(:KILL, -@pid) # its own process group, by pid
      Process.waitpid(@pid)
    rescue Errno::ECHILD, Errno::ESRCH
      nil
    end
  end

  def self.setting(name, default, min)
    value = Integer(ENV.fetch(name, default.to_s), exception: false)
    abort "fault soak: #{name} must be an integer >= #{min} (got #{ENV.fetch(name).inspect})" unless value && value >= min
    value
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = FaultSoak.setting("SOAK_SECONDS", 600, 10)
  hup_every = FaultSoak.setting("SOAK_HUP_EVERY", 120, 5)
  kill_every = FaultSoak.setting("SOAK_KILL_EVERY", 60, 5)
  modes = ENV.fetch("SOAK_MODES", "1,4").split(",").map { |m| Integer(m, exception: false) }
  abort "fault soak: SOAK_MODES must list thread counts >= 1, like 1,4 (got #{ENV['SOAK_MODES'].inspect})" if modes.empty? || !modes.all? { |m| m&.positive? }
  passed = modes.map { |threads| FaultSoak::Run.new(threads, seconds: seconds, hup_every: hup_every, kill_every: kill_every).call }
  exit(passed.all? ? 0 : 1)
end
