# frozen_string_literal: true

require_relative "fault_helper"

# Workers replaced under continuous load, by request count, by memory, by TTOU/TTIN and by
# SIGKILL: a client that never retries loses nothing (but what a SIGKILLed worker had in flight),
# on keep-alive connections too, and the master lives on.
class RecycleFaultTest < FaultTest
  def start(threads, *args, app: "leaky.ru")
    dir = Dir.mktmpdir("bb-test")
    start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--threads", threads.to_s, *args],
                 app: app, workers: 2, dir: dir)
  end

  def recycled(server) = server.log.scan(/worker \d+ \(pid \d+\) exiting after/).size

  [1, 4].each do |threads|
    # Every recycle used to cost one keep-alive request: the worker began its stop right after a
    # response that had promised keep-alive, then closed the connection under the client's next one.
    define_method("test_recycling_by_requests_loses_nothing_threads_#{threads}") do
      server = start(threads, "--max-requests-per-child", "60", "--min-requests-per-child", "30")
      load = load_on(server, keepalive: 3, fresh: 1)
      wait_for(120) { recycled(server) >= 8 }
      load.stop
      assert_nothing_lost(load)
      assert_operator load.ok, :>, 200
      refute server.exited?
    end

    # A leaking app: each worker is recycled once its USS passes max_memory_per_child, and stops
    # taking work at once, so it never runs far past the limit. The exit line gives peak RSS (the
    # kernel keeps no peak of USS): USS plus the few MiB leaky.ru shares with the master.
    define_method("test_recycling_by_memory_loses_nothing_and_stops_near_the_limit_threads_#{threads}") do
      limit = 120_000 # KiB
      server = start(threads, "--max-memory-per-child", limit.to_s)
      load = load_on(server, keepalive: 3, fresh: 1, path: "/?leak=512")
      wait_for(120) { server.log.scan(/stopping: USS \d+ KiB is over max_memory_per_child/).size >= 4 }
      load.stop
      assert_nothing_lost(load)
      peaks = server.log.scan(/exiting after \d+ requests \(peak RSS (\d+) KiB\)/).flatten.map(&:to_i)
      refute_empty peaks
      assert_operator peaks.max, :<, limit * 1.5, "peak RSS of recycled workers: #{peaks}"
    end

    define_method("test_ttou_and_ttin_lose_nothing_threads_#{threads}") do
      server = start(threads, app: "faults.ru")
      load = load_on(server, keepalive: 3, fresh: 1)
      load.wait_ok(100)
      3.times do |i|
        server.signal(:TTIN)
        wait_for(60) { server.worker_pids.size >= 3 + i }
        server.signal(:TTOU)
        wait_for(60) { server.log.scan(/stopping: asked by master/).size >= i + 1 }
        load.wait_ok(100)
      end
      load.stop
      assert_nothing_lost(load)
      refute server.exited?
    end
  end

  # A SIGKILLed worker loses what it had in flight (at most one request per client), nothing more;
  # the master replaces it.
  def test_sigkill_of_a_worker_loses_only_what_it_had_in_flight
    server = start(1, app: "faults.ru")
    clients = { keepalive: 3, fresh: 1, downloads: 2 }
    load = load_on(server, **clients)
    load.wait_ok(100)
    victim = server.worker_pids.first
    Process.kill(:KILL, victim)
    wait_for(60) { server.worker_pids.size >= 3 }
    load.wait_ok(100)
    load.stop
    lost = load.failures.values.sum
    # (one per client at most: the slow downloads are clients too)
    assert_operator lost, :<=, clients.values.sum, "more lost than the killed worker had in flight: #{load.summary}"
    refute server.exited?
  end
end
