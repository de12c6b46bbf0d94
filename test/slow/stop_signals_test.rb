# frozen_string_literal: true

require_relative "../test_helper"

# Repeated stop signals, as a user pressing Ctrl-C in a terminal sends them: to the master and
# its workers alike (the whole process group). The first stops gracefully, the second forces
# the stop, the third (or a QUIT during a stop) exits at once.
# Every check waits for a state (a log line, the client's answer or its absence, the server's exit),
# never for a time: how long a stop takes is the machine's.
class StopSignalsTest < ServerTest
  # gate.ru holds a request in the app until the test opens its gate (#start_long_request);
  # kitchen.ru streams a large response (the slow reader).
  def start(app)
    dir = Dir.mktmpdir("bb-test")
    @stats = "#{dir}/status.sock"
    @gates = Dir.mktmpdir("bb-gates")
    @server = start_server(["-l", "127.0.0.1:0", "--stats-listen", "unix:#{@stats}", "--graceful-timeout", "60",
                            "--write-timeout", "60"], dir: dir, app: app, workers: 2, env: { "BB_GATE_DIR" => @gates })
  end

  # Ctrl-C: the terminal signals the foreground process group (the server runs in its own).
  def ctrl_c(sig = :INT) = Process.kill(sig, -@server.pid)

  def seconds
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    yield
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
  end

  # A request the app runs until its gate opens (gate.ru gives up after 30 s and answers): the
  # graceful stop must wait for it, a forced one must not.
  def start_long_request
    start("gate.ru")
    io = @server.tcp
    io.write("GET /gate?name=long HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app(@stats)
    io
  end

  def open_gate = File.write(File.join(@gates, "long"), "")

  # The stop is under way: the idle worker has stopped and the master has reaped it (the one in the
  # app reads its stop only once the request ends).
  def wait_until_idle_worker_gone
    wait_for(30, "the idle worker stopped and reaped") { @server.log.match?(/worker \d+ \(pid \d+\) exited/) }
  end

  # The request held in the app got no answer: the connection closed under it.
  def assert_cut_short(io)
    assert_equal "", read_all(io, timeout: 30), "the request in the app was not answered"
  end

  def test_first_ctrl_c_is_graceful_and_says_what_more_do
    io = start_long_request
    ctrl_c
    wait_for { @server.log.include?("INT: stopping gracefully") }
    assert_match(/INT again forces the stop, a third time exits at once/, @server.log)
    wait_until_idle_worker_gone
    refute @server.exited?, "a graceful stop waits for the request in the app"
    open_gate # only now may the request end: its answer comes after the stop began
    res = read_response(io)
    assert_equal [200, "gate long opened\n"], [res.status, res.body], "the graceful stop let it finish"
    assert @server.wait_exit(30)&.success?
  ensure
    io&.close
  end

  def test_second_ctrl_c_forces_the_stop
    io = start_long_request
    ctrl_c
    wait_for { @server.log.include?("INT: stopping gracefully") }
    elapsed = seconds do
      ctrl_c
      assert @server.wait_exit(45)&.success?
    end
    assert_match(/INT again: forcing the stop/, @server.log)
    # the worker whose request waits for its gate is killed after FORCE_GRACE: the request never
    # answered (had the stop waited for it, gate.ru would have answered after 30 s)
    assert_match(/still running after the forced stop; killing it/, @server.log)
    assert_cut_short(io)
    # (a lower bound: a loaded machine only makes it longer)
    assert_operator elapsed, :>=, 4, "a forced stop still gives the request in the app FORCE_GRACE (5 s)"
  ensure
    io&.close
  end

  def test_second_ctrl_c_closes_slow_readers_at_once
    # A client that stops reading a large streamed response: its worker is not in the app, but a
    # graceful stop waits for the client (write_timeout 60 s). The forced stop closes it.
    start("kitchen.ru")
    total = 64 << 20
    io = @server.tcp
    io.write("GET /stream-big?n=#{total} HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for(15, "the response queued, the app done") do # what the client does not take is spilled
      status_json(@stats)["workers"].any? { |w| w["state"] == "idle" && w["spill_bytes"].positive? }
    end
    ctrl_c
    wait_for { @server.log.include?("INT: stopping gracefully") }
    # the worker's loop turns while it stops (its slot says "stopping") and still holds the reader's bytes
    wait_for(30, "the stopping worker still holding the slow reader") do
      status_json(@stats)["workers"].any? { |w| w["state"] == "stopping" && w["spill_bytes"].positive? }
    end
    refute @server.exited?, "the graceful stop waits for the slow reader"
    ctrl_c
    assert @server.wait_exit(30)&.success?, "the forced stop ends well before write_timeout (60 s)"
    assert_match(/forcing the stop: closing \d+ connections/, @server.log)
    assert_operator read_all(io, timeout: 30).bytesize, :<, total, "the slow reader was cut off, not served"
  ensure
    io&.close
  end

  # "At once": the workers are killed without FORCE_GRACE (the log says which stop killed them), the
  # request held in the app never answered.
  def test_third_ctrl_c_exits_at_once
    io = start_long_request
    ctrl_c
    wait_for { @server.log.include?("INT: stopping gracefully") }
    ctrl_c
    wait_for { @server.log.include?("INT again: forcing") }
    ctrl_c
    assert @server.wait_exit(30)&.success?
    assert_match(/INT: exiting at once/, @server.log)
    assert_match(/worker pid \d+ still running; killing it/, @server.log)
    refute_match(/after the forced stop; killing it/, @server.log, "killed at once, not after FORCE_GRACE")
    assert_cut_short(io)
    wait_for(15) { @server.worker_pids.none? { |pid| alive?(pid) } } # no worker is left behind
  ensure
    io&.close
  end

  def test_quit_twice_exits_at_once
    io = start_long_request
    @server.signal(:QUIT)
    wait_for { @server.log.include?("QUIT: stopping gracefully") }
    assert_match(/QUIT again exits at once/, @server.log)
    @server.signal(:QUIT)
    assert @server.wait_exit(30)&.success?
    assert_match(/QUIT: exiting at once/, @server.log)
    assert_match(/worker pid \d+ still running; killing it/, @server.log)
    refute_match(/after graceful_timeout; killing it/, @server.log, "killed at once, not after graceful_timeout")
    assert_cut_short(io)
  ensure
    io&.close
  end
end
