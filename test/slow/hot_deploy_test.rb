# frozen_string_literal: true

require_relative "../test_helper"
require "json"

# Hot deploy under Server::Starter (Debian libserver-starter-perl): start_server owns the
# listening sockets and passes them down (SERVER_STARTER_PORT); on HUP it starts a new
# generation of blackbuck, waits --interval, then sends TERM to the old one. Under load,
# no request may fail and the new generation must serve.
class HotDeployTest < ServerTest
  START_SERVER = ENV.fetch("START_SERVER", "start_server")
  LOAD_THREADS = 6       # three per transport
  IDLE_PAUSE = 0.3       # the third client of each transport idles up to this long between requests
  LOAD_MAX_SECONDS = 30  # the load stops by itself after this long, whatever happens
  LOAD_MAX_REQUESTS = 50_000
  PER_PHASE = 100        # requests answered before the HUP, and after the old generation has gone

  def setup
    skip "#{START_SERVER} not installed (apt-get install libserver-starter-perl)" unless system("which #{START_SERVER} >/dev/null 2>&1")
    @dir = Dir.mktmpdir("bb-test")
    @sock = File.join(@dir, "app.sock")
    @log_path = File.join(@dir, "start_server.log")
    @port = free_port
  end

  def teardown
    @starter&.stop
    warn "\n--- start_server log (#{name}) ---\n#{@starter.log}--- end ---" unless passed? || @starter.nil?
    FileUtils.rm_rf(@dir) if @dir
  end

  def test_hup_under_load_drops_nothing_and_the_new_generation_serves
    cmd = [START_SERVER, "--port", "127.0.0.1:#{@port}", "--path", @sock, "--interval", "1", "--",
           RbConfig.ruby, EXE, "-w", "2", File.join(APPS, "kitchen.ru")]
    @starter = ChildProcess.new(cmd, log_path: @log_path, chdir: ROOT)
    wait_for(20) { @starter.worker_pids.size >= 2 }
    old = @starter.worker_pids

    results = Queue.new
    stop = false
    deadline = now + LOAD_MAX_SECONDS
    threads = Array.new(LOAD_THREADS) do |i|
      Thread.new do
        transport = i.even? ? :tcp : :unix
        # Per transport: a busy keep-alive client, a new connection per request, and a keep-alive
        # client that idles between requests (as a proxy's upstream pool does).
        keepalive = i < 2 || i >= 4
        pause = i >= 4 ? IDLE_PAUSE : 0
        load_loop(transport, keepalive, pause, results) { stop || now > deadline || results.size >= LOAD_MAX_REQUESTS }
      end
    end
    wait_for(30, "load against the first generation") { results.size >= PER_PHASE }
    @starter.signal(:HUP)
    wait_for(30) { (@starter.worker_pids - old).size >= 2 } # the new generation is up
    wait_for(30) { @starter.log.scan(/master \(pid \d+\) exiting/).size >= 1 } # and the old one has gone
    after_old = results.size
    wait_for(30, "load against the new generation only") { results.size >= after_old + PER_PHASE }
    stop = true
    threads.each(&:join)

    all = Array.new(results.size) { results.pop }
    failures = all.reject { |r| r[:ok] }
    new_pids = @starter.worker_pids - old
    served_by_new = all.count { |r| r[:ok] && new_pids.include?(r[:pid]) }
    served_by_old = all.count { |r| r[:ok] && old.include?(r[:pid]) }
    summary = "#{all.size} requests, #{failures.size} failed, #{served_by_old} by old workers #{old}, " \
              "#{served_by_new} by new workers #{new_pids}"
    puts "\n  hot deploy: #{summary}" if ENV["VERBOSE"]
    assert_operator all.size, :>, 100, summary
    assert_operator served_by_old, :>, 0, summary
    assert_operator served_by_new, :>, 0, summary
    assert_empty failures.first(10), summary

    # TERM start_server: every process of the group is gone, nothing killed by name.
    @starter.signal(:TERM)
    wait_for(20) { @starter.exited? }
    wait_for(20) { !@starter.group_alive? }
    (old + new_pids).each { |pid| refute alive?(pid), "worker #{pid} is gone" }
    @starter = nil
  end

  private

  # Issues requests until the block says stop; pushes {ok:, pid:, error:} for each.
  def load_loop(transport, keepalive, pause, results)
    io = nil
    until yield
      sleep(rand * pause) if pause.positive?
      io ||= connect(transport)
      reused = io.instance_variable_defined?(:@used)
      begin
        io.write("GET /env HTTP/1.1\r\nHost: x\r\n#{'Connection: close' unless keepalive}\r\n\r\n")
        res = read_response(io)
        raise EOFError, "connection closed before any response#{' (reused keep-alive connection)' if reused}" unless res
        raise "status #{res.status}" unless res.status == 200

        results << { ok: true, pid: JSON.parse(res.body)["worker.pid"].to_i }
        io.instance_variable_set(:@used, true)
        if !keepalive || res["connection"]&.casecmp?("close")
          io.close
          io = nil
        end
      rescue StandardError => e
        results << { ok: false, error: "#{transport} #{keepalive ? 'keep-alive' : 'new-conn'}: #{e.class}: #{e.message}" }
        io&.close
        io = nil
      end
    end
  ensure
    io&.close
  end

  def connect(transport) = transport == :tcp ? TCPSocket.new("127.0.0.1", @port) : UNIXSocket.new(@sock)

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
