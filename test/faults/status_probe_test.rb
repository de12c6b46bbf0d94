# frozen_string_literal: true

require_relative "fault_helper"

# Kubernetes probes under load while 200 status connections sit idle (a scraper's leaked
# keep-alives, a port scan) and a HUP re-exec runs: every /live and /ready is answered, well
# within a probe's default 1 s timeout, and the app's clients lose nothing.
class StatusProbeFaultTest < FaultTest
  IDLE = 200
  PROBE_TIMEOUT = 1.0 # seconds: Kubernetes' default timeoutSeconds

  def probe(path, target)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    io = UNIXSocket.new(path)
    io.write("GET #{target} HTTP/1.1\r\nHost: x\r\n\r\n")
    res = read_response(io, timeout: PROBE_TIMEOUT)
    [res&.status, Process.clock_gettime(Process::CLOCK_MONOTONIC) - t]
  rescue Timeout::Error
    [nil, PROBE_TIMEOUT]
  ensure
    io&.close
  end

  def test_probes_are_answered_beside_idle_status_connections_through_a_reload
    dir = Dir.mktmpdir("bb-test")
    status = "#{dir}/status.sock"
    server = start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{status}"],
                          app: "faults.ru", workers: 2, dir: dir)
    load = load_on(server)
    idle = Array.new(IDLE) { UNIXSocket.new(status) }
    load.wait_ok(50)
    server.signal(:HUP)
    probes = []
    until server.log.include?("new workers ready")
      probes << probe(status, "/live") << probe(status, "/ready")
      raise "master exited" if server.exited?
      break if probes.size > 2000
    end
    load.wait_ok(50)
    load.stop
    bad = probes.reject { |code, secs| code == 200 && secs < PROBE_TIMEOUT }
    assert_empty bad, "probes not answered in time: #{bad.first(5)}"
    assert_operator probes.size, :>=, 2
    assert_nothing_lost(load)
  ensure
    idle&.each(&:close)
  end
end
