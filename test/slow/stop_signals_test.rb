# frozen_string_literal: true

require_relative "../test_helper"

# Repeated stop signals, as a user pressing Ctrl-C in a terminal sends them: to the master and
# its workers alike (the whole process group). The first stops gracefully, the second forces
# the stop, the third (or a QUIT during a stop) exits at once.
class StopSignalsTest < ServerTest
  def setup
    dir = Dir.mktmpdir("bb-test")
    @stats = "#{dir}/status.sock"
    @server = start_server(["-l", "127.0.0.1:0", "--stats-listen", "unix:#{@stats}", "--graceful-timeout", "60",
                            "--write-timeout", "60"], dir: dir, app: "kitchen.ru", workers: 2)
  end

  # Ctrl-C: the terminal signals the foreground process group (the server runs in its own).
  def ctrl_c(sig = :INT) = Process.kill(sig, -@server.pid)

  def seconds
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    yield
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
  end

  # A request the app runs for 20 s: the graceful stop must wait for it.
  def start_long_request
    io = @server.tcp
    io.write("GET /sleep?t=20 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until_in_app(@stats)
    io
  end

  def test_first_ctrl_c_is_graceful_and_says_what_more_do
    io = start_long_request
    ctrl_c
    wait_for { @server.log.include?("INT: stopping gracefully") }
    assert_match(/INT again forces the stop, a third time exits at once/, @server.log)
    sleep 1
    refute @server.exited?, "a graceful stop waits for the request in the app"
  ensure
    io&.close
  end

  def test_second_ctrl_c_forces_the_stop
    io = start_long_request
    ctrl_c
    wait_for { @server.log.include?("INT: stopping gracefully") }
    elapsed = seconds do
      ctrl_c
      assert @server.wait_exit(15)&.success?
    end
    assert_match(/INT again: forcing the stop/, @server.log)
    # the worker running the 20 s request is killed after FORCE_GRACE (5 s), not after 20 s or 60 s
    assert_operator elapsed, :<, 10, "the forced stop took #{elapsed.round(2)} s"
    assert_operator elapsed, :>=, 4, "a forced stop still gives the request in the app FORCE_GRACE"
    assert_match(/still running after the forced stop; killing it/, @server.log)
  ensure
    io&.close
  end

  def test_second_ctrl_c_closes_slow_readers_at_once
    # A client that stops reading a large streamed response: its worker is not in the app, but a
    # graceful stop waits for the client (write_timeout 60 s). The forced stop closes it.
    io = @server.tcp
    io.write("GET /stream-big?n=#{64 << 20} HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for(15, "the response queued, the app done") do # what the client does not take is spilled
      status_json(@stats)["workers"].any? { |w| w["state"] == "idle" && w["spill_bytes"].positive? }
    end
    ctrl_c
    wait_for { @server.log.include?("INT: stopping gracefully") }
    sleep 1.5
    refute @server.exited?, "the graceful stop waits for the slow reader"
    elapsed = seconds do
      ctrl_c
      assert @server.wait_exit(15)&.success?
    end
    assert_operator elapsed, :<, 3, "the forced stop took #{elapsed.round(2)} s"
    assert_match(/forcing the stop: closing \d+ connections/, @server.log)
  ensure
    io&.close
  end

  def test_third_ctrl_c_exits_at_once
    io = start_long_request
    elapsed = seconds do
      ctrl_c
      wait_for { @server.log.include?("INT: stopping gracefully") }
      ctrl_c
      wait_for { @server.log.include?("INT again: forcing") }
      ctrl_c
      assert @server.wait_exit(15)&.success?
    end
    assert_operator elapsed, :<, 3, "three Ctrl-C took #{elapsed.round(2)} s"
    assert_match(/INT: exiting at once/, @server.log)
    wait_for(5) { @server.worker_pids.none? { |pid| alive?(pid) } } # no worker is left behind
  ensure
    io&.close
  end

  def test_quit_twice_exits_at_once
    io = start_long_request
    elapsed = seconds do
      @server.signal(:QUIT)
      wait_for { @server.log.include?("QUIT: stopping gracefully") }
      assert_match(/QUIT again exits at once/, @server.log)
      @server.signal(:QUIT)
      assert @server.wait_exit(15)&.success?
    end
    assert_operator elapsed, :<, 3
    assert_match(/QUIT: exiting at once/, @server.log)
  ensure
    io&.close
  end
end
