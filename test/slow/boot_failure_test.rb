# frozen_string_literal: true

require_relative "../test_helper"

# Issue 22: workers that can never boot (an after_fork that raises) were replaced every second for
# ever while clients waited in the listen queue. Now each replacement waits twice as long as the last
# (Respawn::BACKOFF up to BACKOFF_MAX), and after Respawn::BOOT_ATTEMPTS (10)
# workers in a row exit before they are ready, the master stops and exits 1 with one line saying
# why. A worker that boots resets the count; one that dies after it was ready never counts.
class BootFailureTest < ServerTest
  def config_file(dir, body)
    path = File.join(dir, "blackbuck.rb")
    File.write(path, body)
    path
  end

  def test_workers_that_cannot_boot_make_the_master_exit_non_zero
    dir = Dir.mktmpdir("bb-test")
    conf = config_file(dir, "after_fork { |_server, _index| raise 'boom' }\n")
    # 4 workers: 4 failures a round, so the 10th comes in the third round (after waits of 1 s and 2 s).
    server = start_server(["-l", "127.0.0.1:0", "-c", conf], dir: dir, workers: 4, wait: false)
    status = server.wait_exit(60)
    refute_nil status, "the master still runs: #{server.log.scan(/crashed/).size} workers crashed so far"
    assert_equal 1, status.exitstatus
    log = server.log
    assert_match(/workers cannot boot: after_fork raised RuntimeError: boom \(10 attempts in a row\); exiting/, log)
    assert_equal 1, log.scan(/workers cannot boot/).size, "one line"
    assert_match(/before it was ready \(after_fork raised RuntimeError: boom; boot failure 1 of 10 in a row\); replacing it in 1s/, log)
    assert_match(/boot failure 5 of 10 in a row\); replacing it in 2s/, log, "the wait doubles")
    crashed = log.scan(/worker \d+ crashed/).size
    assert_operator crashed, :>=, 10
    assert_operator crashed, :<=, 12, "three rounds of 4 at most"
    assert_match(/master \(pid \d+\) exiting/, log)
  end

  # after_fork raises on a worker's first attempt only: each is replaced once and the server serves.
  def test_a_worker_that_fails_its_first_boot_is_replaced_and_serves
    dir = Dir.mktmpdir("bb-test")
    conf = config_file(dir, <<~RUBY)
      after_fork do |_server, index|
        flag = File.join(#{dir.inspect}, "booted-\#{index}")
        unless File.exist?(flag)
          File.write(flag, "")
          raise "first boot of worker \#{index} fails"
        end
      end
    RUBY
    server = start_server(["-l", "127.0.0.1:0", "-c", conf], dir: dir, workers: 2)
    io = server.tcp
    assert_equal 200, request(io, "GET", "/").status
    assert_match(/boot failure 1 of 10 in a row/, server.log)
    refute server.exited?
  ensure
    io&.close
  end

  # A worker that served, then died, is no boot failure; and one that boots resets the count. Here
  # every other boot fails: failure 1, a worker that serves, SIGKILL, then failure 1 again (not 2).
  def test_the_count_is_of_failures_in_a_row_and_of_boots_only
    dir = Dir.mktmpdir("bb-test")
    conf = config_file(dir, <<~RUBY)
      after_fork do |_server, _index|
        count = File.join(#{dir.inspect}, "boots")
        n = File.exist?(count) ? File.read(count).to_i : 0
        File.write(count, (n + 1).to_s)
        raise "boot \#{n} fails" if n.even?
      end
    RUBY
    server = start_server(["-l", "127.0.0.1:0", "-c", conf], dir: dir, workers: 1)
    first = server.worker_pids.last
    io = server.tcp
    assert_equal 200, request(io, "GET", "/").status
    io.close
    Process.kill(:KILL, first)
    wait_for(30, "a new worker after the failed boot") { (server.worker_pids - [first]).any? }
    io = server.tcp
    assert_equal 200, request(io, "GET", "/").status
    log = server.log
    assert_match(/worker 0 \(pid #{first}\) killed by SIGKILL; replacing it/, log, "no boot failure: it had served")
    assert_equal 2, log.scan(/boot failure 1 of 10 in a row/).size, log.scan(/boot failure \d+ of/).inspect
    refute_match(/boot failure 2 of/, log)
  ensure
    io&.close
  end
end
