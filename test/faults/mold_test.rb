# frozen_string_literal: true

require_relative "fault_helper"
require "json"

# The mold (refork_after) under load, with workers recycling all the time (max_requests_per_child),
# so the master asks the mold for a worker again and again: a HUP whose new code does not boot
# keeps the mold; a mold that dies while new code is on disk (a deploy, no HUP yet) is replaced by
# one a worker forks, running the code the workers run; a stopped mold never stops the master's
# loop. Nothing may be lost.
class MoldFaultTest < FaultTest
  PROBE_MAX = 1.0 # seconds GET /live may take while the master waits for a stopped mold (its ask: 5 s)

  def app(version)
    <<~RU
      VERSION = #{version.inspect}
      run ->(_env) { b = "version=\#{VERSION} pid=\#{Process.pid}\\n"; [200, { "content-type" => "text/plain", "content-length" => b.bytesize.to_s }, [b]] }
    RU
  end

  def start(workers: 2)
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/app.ru", app("v1"))
    File.write("#{dir}/bb.rb", "refork_after 10\nmax_requests_per_child 4000\nmin_requests_per_child 2000\n")
    start_server(["-c", "#{dir}/bb.rb", "-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock",
                  "--stats-listen", "unix:#{dir}/status.sock"], app: "#{dir}/app.ru", workers: workers, dir: dir)
  end

  def status(server) = status_json(stats_path(server))

  # The mold of generation 1 is there (the load drives the refork; the list is then exhausted), and
  # both workers serve (neither is starting, nor stopping to recycle).
  def wait_for_mold(server)
    wait_for(60, "the mold of generation 1") do
      s = status(server)
      s if s.dig("refork", "generation") == 1 && s.dig("refork", "mold") && s["workers"].size == 2 &&
           s["workers"].all? { |w| %w[idle busy].include?(w["state"]) }
    end
  end

  # Workers recycled (exited with status 0) so far, each replaced by a worker asked of the mold.
  def recycled(server) = log_count(server, /worker \d+ \(pid \d+\) exited with status 0/)

  def version_served(server)
    io = server.tcp
    res = request(io, "GET", "/")
    res.body[/version=(\w+)/, 1]
  ensure
    io&.close
  end

  # Item 3 of issue 32: the HUP stopped the mold before the check; the check failed, a new mold
  # booting the broken code failed too, and no recycled worker was replaced: the load stalled.
  def test_a_hup_whose_code_does_not_boot_keeps_the_mold_and_workers_are_replaced
    server = start
    load = load_on(server)
    mold = wait_for_mold(server).dig("refork", "mold", "pid")
    File.write("#{server.dir}/app.ru", "raise 'the new code is broken'\n")
    server.signal(:HUP)
    wait_log(server, /HUP: the new code does not boot; the running workers keep serving/)
    before = recycled(server)
    wait_log(server, /worker \d+ \(pid \d+\) exited with status 0/, before + 6)
    load.wait_ok(100)
    load.stop
    s = status(server)
    assert_equal mold, s.dig("refork", "mold", "pid"), "the old mold stays and forks the replacements"
    assert(s["workers"].all? { |w| w["forked_by"] == "mold" })
    assert_alive_master(server)
    assert_nothing_lost(load)
    refute_match(/mold \(pid #{mold}\) stopping/, server.log)
  end

  # A deploy has replaced the files, no HUP yet: the mold dies. The new code on disk has passed no
  # check; the replacement mold is forked by a worker, so every worker still runs the code the
  # server runs (v1), none the unchecked v2.
  def test_a_mold_that_dies_during_a_deploy_is_replaced_from_a_worker_not_from_the_disk
    server = start
    load = load_on(server)
    mold = wait_for_mold(server).dig("refork", "mold", "pid")
    File.write("#{server.dir}/app.ru", app("v2"))
    logged = server.log.bytesize # what the log said before the kill (the master names a mold that
    # died in more than one way: reaped, or found gone when asked for a worker)
    Process.kill(:KILL, mold)
    s = wait_for(60, "a new mold") do
      st = status(server)
      st if st.dig("refork", "mold") && st.dig("refork", "mold", "pid") != mold
    end
    assert_equal false, s.dig("refork", "mold", "booted_app"), "forked by a worker: #{s['refork']}"
    before = recycled(server)
    wait_log(server, /worker \d+ \(pid \d+\) exited with status 0/, before + 6) # workers forked by the new mold
    load.wait_ok(100)
    load.stop
    assert_equal %w[v1], Array.new(10) { version_served(server) }.uniq
    refute_match(/booting the app/, server.log.byteslice(logged..))
    assert_alive_master(server)
    assert_nothing_lost(load)
  end

  # Item 19 of issue 32: the master waited for the mold's answer in its loop, 5 s per worker asked:
  # GET /live, signals, reaping all waited. Now it asks and reads the answer when it comes; a mold
  # that gives none in time is killed and replaced.
  def test_a_stopped_mold_does_not_stop_the_masters_loop
    server = start
    load = load_on(server)
    mold = wait_for_mold(server).dig("refork", "mold", "pid")
    Process.kill(:STOP, mold)
    slowest = 0.0
    until log_count(server, /the mold \(pid #{mold}\) could not fork worker \d+ \(no answer in \d+s\)/).positive?
      flunk "the stopped mold was never given up on:\n#{server.log}" if (waited ||= now) + 60 < now
      slowest = [slowest, probe_live(server)].max
    end
    assert_operator slowest, :<, PROBE_MAX, "GET /live answered within #{PROBE_MAX}s while the mold was stopped"
    wait_for(30, "the stopped mold killed") { !alive?(mold) }
    wait_for(60, "a new mold") do
      st = status(server)
      st.dig("refork", "mold") && st.dig("refork", "mold", "pid") != mold
    end
    before = recycled(server)
    wait_log(server, /worker \d+ \(pid \d+\) exited with status 0/, before + 4)
    load.wait_ok(100)
    load.stop
    assert_alive_master(server)
    assert_nothing_lost(load)
  ensure
    kill_if_alive(mold)
  end

  private

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Seconds GET /live took on the status listener (10 at most: a timeout counts as 10).
  def probe_live(server)
    started = now
    io = UNIXSocket.new(stats_path(server))
    io.write("GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return 10.0 unless io.wait_readable(10)

    assert_match(%r{\AHTTP/1\.1 200 }, io.readpartial(4096))
    now - started
  ensure
    io&.close
  end

  def assert_alive_master(server)
    refute server.exited?, "the master died: #{server.log.lines.last(5).join}"
  end
end
