# frozen_string_literal: true

require_relative "fault_helper"

# HUP re-execs under continuous load: back to back, and with signals arriving while the new code
# boots. Nothing may be lost and the master never dies.
class RestartFaultTest < FaultTest
  REEXEC = /HUP: re-executing the master/
  HANDED_OVER = /new workers ready; \d+ old workers finishing/

  # config.ru that notes each boot (the booting process's pid, in the file "boots") and then
  # sleeps as long as the file "boot_sleep" says (0 at first). /download?bytes=N for the slow readers.
  def slow_boot_app(dir)
    File.write("#{dir}/boot_sleep", "0")
    File.write("#{dir}/app.ru", <<~RU)
      File.write(#{"#{dir}/boots".inspect}, "\#{Process.pid}\n", mode: "a")
      sleep Float(File.read(#{"#{dir}/boot_sleep".inspect}))
      require #{File.expand_path("../apps/download", __dir__).inspect}
      run ->(env) { Download.call(env) || [200, { "content-type" => "text/plain", "content-length" => "3" }, ["ok\\n"]] }
    RU
    "#{dir}/app.ru"
  end

  # Boots of the app in the master itself (a re-executed image loading the new code), not in
  # the boot check's process.
  def master_boots(server)
    File.read("#{server.dir}/boots").split.count { |pid| pid.to_i == server.pid }
  end

  # Waits until the master's (count)th boot of the app has begun: a re-exec's new image is up to
  # its app, its traps set.
  def wait_master_boot(server, count)
    wait_for(60) { master_boots(server) >= count || server.exited? }
    refute server.exited?, "the master died: #{server.log.lines.last(5).join}"
  end

  def start(threads, dir: Dir.mktmpdir("bb-test"))
    args = ["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--threads", threads.to_s, "--stats-listen", "unix:#{dir}/status.sock"]
    start_server(args, app: slow_boot_app(dir), workers: 2, dir: dir)
  end

  [1, 4].each do |threads|
    # Each HUP as soon as the previous one's new image boots the app: its workers start while
    # the old ones still serve, and the HUP waits for that handover.
    define_method("test_ten_hups_back_to_back_threads_#{threads}") do
      server = start(threads)
      master = server.pid
      load = load_on(server)
      load.wait_ok(50)
      File.write("#{server.dir}/boot_sleep", "0.3")
      10.times do |i|
        server.signal(:HUP)
        wait_master_boot(server, i + 2)
      end
      wait_log(server, HANDED_OVER, 10)
      load.wait_ok(50)
      load.stop
      refute server.exited?, "the master died: #{server.log.lines.last(5).join}"
      assert_equal master, server.pid
      assert_nothing_lost(load)
      assert_empty server.log.scan(/^.*(?:IOError|ERROR).*$/), "errors in the log"
    end
  end

  # HUP, USR1 (logrotate) and TERM sent to a re-executed master while its new code boots: queued
  # and handled once it runs; none kills it.
  def test_signals_during_a_reexecs_boot_are_handled_once_it_runs
    server = start(1)
    File.write("#{server.dir}/boot_sleep", "1.5")
    load = load_on(server)
    load.wait_ok(20)
    server.signal(:HUP)
    wait_master_boot(server, 2)
    server.signal(:USR1)
    server.signal(:HUP)
    # (in signal-number order: the kernel delivers pending signals so)
    wait_log(server, /signals received while this image booted, handled now: (USR1 HUP|HUP USR1)/)
    wait_log(server, REEXEC, 2) # the HUP queued during the boot reloads again, once the handover is done
    wait_log(server, HANDED_OVER, 2)
    load.wait_ok(20)
    refute server.exited?, "the master died: #{server.log.lines.last(5).join}"

    server.signal(:HUP)
    wait_master_boot(server, 4)
    server.signal(:TERM)
    status = server.wait_exit(60)
    load.stop
    assert status&.success?, "TERM during a re-exec's boot stops gracefully: #{status.inspect}"
    assert_match(/signals received while this image booted, handled now: TERM/, server.log)
    # refused once the stop closed the listeners; reset only in the instant of the close (StopFaultTest)
    assert_nothing_lost(load, allowed: { refused: Float::INFINITY, eof_new: 2 })
  end

  # A second HUP while the first one's boot check runs: not dropped, it reloads once more.
  def test_a_hup_during_the_boot_check_is_not_dropped
    server = start(1)
    File.write("#{server.dir}/boot_sleep", "1")
    load = load_on(server)
    load.wait_ok(20)
    server.signal(:HUP)
    wait_log(server, /HUP: checking that the new code boots/)
    server.signal(:HUP)
    wait_log(server, REEXEC, 2)
    wait_log(server, HANDED_OVER, 2)
    load.wait_ok(20)
    load.stop
    refute server.exited?
    assert_match(/the new image handles the signals queued here: HUP|reloading once they serve/, server.log)
    assert_nothing_lost(load)
  end
end
