# frozen_string_literal: true

require_relative "fault_helper"

# Kubernetes probes under load while 200 status connections sit idle (a scraper's leaked
# keep-alives, a port scan) and a HUP re-exec runs: every /live and /ready is answered, and the
# app's clients lose nothing. How fast (Kubernetes' default timeoutSeconds is 1 s) is the machine's
# and a benchmark's to say; this test waits PROBE_WAIT for each answer, and what it asserts is that
# every one comes.
class StatusProbeFaultTest < FaultTest
  IDLE = 200
  PROBE_WAIT = 30 # seconds an answer is waited for before the probe counts as unanswered

  # The status code, or nil when no answer came.
  def probe(path, target)
    io = UNIXSocket.new(path)
    io.write("GET #{target} HTTP/1.1\r\nHost: x\r\n\r\n")
    read_response(io, timeout: PROBE_WAIT)&.status
  rescue Timeout::Error
    nil
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
    bad = probes.reject { |code| code == 200 }
    assert_empty bad, "probes not answered 200: #{bad.first(5)}"
    assert_operator probes.size, :>=, 2
    assert_nothing_lost(load)
  ensure
    idle&.each(&:close)
  end
end
