# frozen_string_literal: true

require_relative "../test_helper"
require "net/http"
require "etc"

# Lifecycle under orchestrators: GET /ready and /live on the status listener, TERM's
# shutdown_delay (Kubernetes), sd_notify to a fake $NOTIFY_SOCKET (systemd Type=notify:
# READY, RELOADING around a HUP re-exec, STOPPING, STATUS, WATCHDOG), and the default worker
# count under a cgroup CPU quota.
class LifecycleTest < ServerTest
  def get(path, sock) = request(UNIXSocket.new(sock).tap { |io| (@ios ||= []) << io }, "GET", path)

  def teardown
    (@ios || []).each(&:close)
    super
  end

  def start_with_status(args = [], **opts)
    dir = Dir.mktmpdir("bb-test")
    @stats = "#{dir}/stats.sock"
    start_server(["-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{@stats}", *args], dir: dir, **opts)
  end

  # During the delay (30 s: longer than any loaded machine takes for the checks, and never waited
  # for; a second TERM ends it, test_a_second_term_ends_the_delay_at_once) the server answers as it
  # says.
  def test_ready_and_live_then_shutdown_delay_keeps_serving_while_not_ready
    server = start_with_status(["--shutdown-delay", "30"], app: "kitchen.ru")
    assert_equal [200, "ready\n"], get("/ready", @stats).then { |r| [r.status, r.body] }
    assert_equal [200, "live\n"], get("/live", @stats).then { |r| [r.status, r.body] }
    server.signal(:TERM)
    wait_for(15) { get("/ready", @stats).status == 503 }
    assert_equal "stopping\n", get("/ready", @stats).body
    assert_equal 200, get("/live", @stats).status, "the master's loop still turns"
    refute server.exited?, "the delay keeps the server up"
    assert_equal 200, get("/hello", server.unix_path).status, "new requests are still served during the delay"
    assert_match(/TERM: not ready \(GET \/ready answers 503\); serving 30s more \(shutdown_delay\)/, server.log)
  end

  # The delay over, the graceful stop begins by itself: not before (a lower bound, which a loaded
  # machine only makes longer).
  def test_the_stop_begins_when_the_shutdown_delay_is_over
    server = start_with_status(["--shutdown-delay", "2"])
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    server.signal(:TERM)
    assert server.wait_exit(30)&.success?
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - t, :>=, 2, "the stop waited for shutdown_delay"
    assert_match(/serving 2s more \(shutdown_delay\), then stopping gracefully/, server.log)
    assert_match(/worker 0 \(pid \d+\) stopping: asked by master/, server.log)
  end

  # GET /ready says 503 until a worker serves: workers that take 1.5 s in after_fork.
  def test_ready_waits_for_a_worker
    dir = Dir.mktmpdir("bb-test")
    @stats = "#{dir}/stats.sock"
    File.write("#{dir}/slow_boot.rb", "after_fork { |_server, _index| sleep 1.5 }\n")
    server = start_server(["-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{@stats}", "-c", "#{dir}/slow_boot.rb"],
                          dir: dir, wait: false)
    wait_for(10) { File.socket?(@stats) }
    assert_equal [503, "starting\n"], get("/ready", @stats).then { |r| [r.status, r.body] }, "no worker serves yet"
    assert_equal 200, get("/live", @stats).status
    server.wait_ready
    assert_equal 200, get("/ready", @stats).status
  end

  def test_a_second_term_ends_the_delay_at_once
    server = start_with_status(["--shutdown-delay", "30"])
    server.signal(:TERM)
    wait_for(15) { server.log.include?("TERM: not ready") }
    server.signal(:TERM)
    assert server.wait_exit(10)&.success?, "the second TERM began the graceful stop"
  end

  # The request is held in the app (gate.ru) until /ready has been asked during the stop.
  def test_ready_says_503_during_a_graceful_stop
    gates = Dir.mktmpdir("bb-gates")
    server = start_with_status([], app: "gate.ru", env: { "BB_GATE_DIR" => gates })
    io = UNIXSocket.new(server.unix_path)
    io.write("GET /gate?name=held HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app(@stats)
    server.signal(:TERM)
    wait_for(15) { server.log.include?("TERM: stopping gracefully") }
    assert_equal 503, get("/ready", @stats).status, "the status listener answers until the master exits"
    File.write(File.join(gates, "held"), "")
    assert_equal 200, read_response(io, timeout: 30).status
    assert server.wait_exit(30)&.success?
  ensure
    File.write(File.join(gates, "held"), "") if gates
    io&.close
  end

  # A fake systemd: a datagram socket reading what the master says.
  class FakeSystemd
    attr_reader :path

    def initialize(path)
      @path = path
      @socket = Socket.new(:UNIX, :DGRAM, 0)
      @socket.bind(Socket.sockaddr_un(path.start_with?("@") ? "\0#{path[1..]}" : path))
    end

    # The next message matching pattern (every message read is kept in #seen with its arrival time).
    def wait_for(pattern, timeout: 20)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      loop do
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise "no #{pattern.inspect} from the master; heard: #{seen.map(&:last).inspect}" if left <= 0
        next unless @socket.wait_readable(left)

        msg = @socket.recv(4096)
        seen << [Process.clock_gettime(Process::CLOCK_MONOTONIC), msg]
        return msg if msg.match?(pattern)
      end
    end

    def seen = (@seen ||= [])

    def close = @socket.close
  end

  def test_sd_notify_ready_watchdog_reloading_stopping
    dir = Dir.mktmpdir("bb-test")
    systemd = FakeSystemd.new("#{dir}/notify.sock")
    server = start_server(["-l", "unix:#{dir}/app.sock"], app: "env_probe.ru", workers: 2, dir: dir, wait: false,
                          env: { "NOTIFY_SOCKET" => systemd.path, "WATCHDOG_USEC" => "400000" })
    ready = systemd.wait_for(/READY=1/)
    assert_match(/^MAINPID=#{server.pid}$/, ready)
    assert_match(/^STATUS=2 workers/, ready)
    server.wait_ready
    assert_equal "nil", get("/NOTIFY_SOCKET", server.unix_path).body, "the app does not see the master's socket"

    # WATCHDOG=1 every half of WATCHDOG_USEC (0.2 s) while the loop turns
    first = systemd.wait_for(/WATCHDOG=1/)
    5.times { systemd.wait_for(/WATCHDOG=1/, timeout: 2) }
    pings = systemd.seen.select { |_, m| m == "WATCHDOG=1\n" }.map(&:first)
    gaps = pings.each_cons(2).map { |a, b| b - a }
    assert_operator gaps.max, :<, 0.6, "watchdog pings #{gaps.map { |g| g.round(2) }} apart (want ~0.2 s)"
    refute_nil first

    # HUP: RELOADING=1 (with MONOTONIC_USEC), then READY=1 from the same pid once the new workers run
    server.signal(:HUP)
    reloading = systemd.wait_for(/RELOADING=1/)
    assert_match(/^MONOTONIC_USEC=\d+$/, reloading)
    again = systemd.wait_for(/READY=1/, timeout: 60)
    assert_match(/^MAINPID=#{server.pid}$/, again, "the same main pid after the re-exec")

    server.signal(:TERM)
    assert_match(/^STATUS=stopping gracefully/, systemd.wait_for(/STOPPING=1/))
    assert server.wait_exit(15)&.success?
  ensure
    systemd&.close
  end

  def test_sd_notify_to_an_abstract_socket
    name = "@blackbuck-test-#{Process.pid}-#{rand(1 << 30)}"
    systemd = FakeSystemd.new(name)
    server = start_server(["-l", "127.0.0.1:0"], wait: false, env: { "NOTIFY_SOCKET" => name })
    assert_match(/^MAINPID=#{server.pid}$/, systemd.wait_for(/READY=1/))
  ensure
    systemd&.close
  end

  # The default worker count follows a cgroup CPU quota: one CPU's worth on a machine with more.
  def test_workers_default_to_the_cgroup_cpu_quota
    skip "needs root to make a cgroup" unless Process.uid.zero?
    skip "needs at least 2 CPUs" if Etc.nprocessors < 2
    base = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup"].find { |d| File.exist?("#{d}/cpu.cfs_quota_us") || File.exist?("#{d}/cgroup.subtree_control") }
    skip "no writable cgroup cpu controller" unless base
    group = "#{base}/bb-test-#{Process.pid}"
    begin
      Dir.mkdir(group)
    rescue SystemCallError => e
      skip "cannot make a cgroup here: #{e.message}"
    end
    if File.exist?("#{group}/cpu.cfs_quota_us")
      File.write("#{group}/cpu.cfs_quota_us", "100000")
      File.write("#{group}/cpu.cfs_period_us", "100000")
    elsif File.exist?("#{group}/cpu.max")
      File.write("#{group}/cpu.max", "100000 100000")
    else
      skip "the cpu controller is not enabled for #{base}'s children"
    end
    dir = Dir.mktmpdir("bb-test")
    cmd = ["sh", "-c", "echo $$ > #{group}/cgroup.procs && exec \"$@\"", "sh",
           RbConfig.ruby, EXE, "-l", "unix:#{dir}/app.sock", File.join(APPS, "hello.ru")]
    server = ChildProcess.new(cmd, log_path: "#{dir}/server.log", env: { "WEB_CONCURRENCY" => nil })
    wait_for(20) { server.log.include?("ready") || server.exited? }
    assert_match(/, 1 worker,/, server.log, "one CPU of quota on a #{Etc.nprocessors}-CPU machine")
  ensure
    server&.stop
    if group && Dir.exist?(group)
      wait_for(15) { File.read("#{group}/cgroup.procs").strip.empty? }
      Dir.rmdir(group)
    end
  end
end
