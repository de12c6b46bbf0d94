# frozen_string_literal: true

# Parsers of the load tools' outputs, and the report's aggregation: no servers, no load.
# Run: ruby bench/test/drivers_test.rb   (or rake bench:test)
require "minitest/autorun"
require_relative "fake_rubies"
require "tmpdir"
require_relative "../lib/blackbuck_bench/runner"

class DriversTest < Minitest::Test
  include FakeRubies

  # The tests below describe a run on Debian's Ruby 3.1 (server_ruby_test.rb: on 3.4 and 4.0).
  def setup
    super
    @saved_ruby = BlackbuckBench::ServerRuby.current
    BlackbuckBench::ServerRuby.current = FakeRubies::DEBIAN_31
  end

  def teardown
    BlackbuckBench::ServerRuby.current = @saved_ruby
    super
  end

  include BlackbuckBench

  WRK_TEXT = <<~OUT
    Running 30s test @ http://localhost:8080/
      6 threads and 600 connections
      Thread Stats   Avg      Stdev     Max   +/- Stdev
        Latency     1.73ms  244.96us   6.62ms   81.28%
        Req/Sec    57.64k     4.04k   66.56k    69.06%
      Latency Distribution
         50%  729.00us
         75%    0.88ms
         90%    1.04ms
         99%    1.50ms
      9762337 requests in 30.00s, 1.28GB read
      Socket errors: connect 0, read 3, write 0, timeout 56
      Non-2xx or 3xx responses: 12
    Requests/sec: 325426.21
    Transfer/sec:     43.76MB
  OUT

  def test_wrk_text
    r = Wrk.new("wrk", "/bin/true").parse(WRK_TEXT, Dir.tmpdir)
    assert_in_delta 325_426.21, r.rps
    assert_equal 9_762_337, r.requests
    assert_in_delta 30.0, r.seconds
    assert_in_delta 0.729, r.p50_ms
    assert_in_delta 1.5, r.p99_ms
    assert_equal 3 + 56 + 12, r.errors
    assert_equal({ "connect" => 0, "read" => 3, "write" => 0, "timeout" => 56, "non_2xx_3xx" => 12 }, r.error_detail)
  end

  def test_blackbuck_load_json_v1
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "load.json"), JSON.generate(
        "schema_version" => 1, "runtime_s" => 2.0, "requests" => 1000, "requests_per_sec" => 500.0,
        "errors" => { "connect" => 1, "read" => 0, "write" => 0, "timeout" => 2, "status" => 3, "connect_retry" => 7 },
        "latency_us" => { "percentiles" => { "50" => 1500, "99" => 9000 } }
      ))
      r = BlackbuckLoad.new("blackbuck-load", "/bin/true").parse("", dir)
      assert_in_delta 500.0, r.rps
      assert_equal 1000, r.requests
      assert_in_delta 1.5, r.p50_ms
      assert_in_delta 9.0, r.p99_ms
      assert_equal 6, r.errors, "connect_retry is reported but not counted as an error"
      assert_equal 7, r.error_detail["connect_retry"]
    end
  end

  def test_blackbuck_load_falls_back_to_text
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "load.json"), '{"schema_version": 2}')
      r = BlackbuckLoad.new("blackbuck-load", "/bin/true").parse(WRK_TEXT, dir)
      assert_in_delta 325_426.21, r.rps
    end
  end

  def test_h2load
    text = <<~OUT
      finished in 2.00s, 12345.50 req/s, 1.2MB/s
      requests: 24691 total, 24691 started, 24691 done, 24690 succeeded, 1 failed, 1 errored, 0 timeout
      status codes: 24690 2xx, 0 3xx, 0 4xx, 0 5xx
    OUT
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "h2load.log"), (1..100).map { |i| "1700000000000000\t200\t#{i * 1000}\n" }.join)
      r = H2load.new("h2load", "/bin/true").parse(text, dir)
      assert_equal 24_690, r.requests
      assert_in_delta 12_345.0, r.rps
      assert_in_delta 51.0, r.p50_ms
      assert_in_delta 100.0, r.p99_ms
      assert_equal 2, r.errors
    end
  end

  def test_h2load_sizes_request_count_from_expected_rate
    h = H2load.new("h2load", "/bin/true")
    h.instance_variable_set(:@expected_rps, 20_000)
    argv = h.command({ transport: "unix", unix_path: "/tmp/x.sock" },
                     { threads: 1, connections: 50, duration: 2, timeout: 5 }, false, Dir.tmpdir)
    assert_equal "40000", argv[argv.index("-n") + 1]
    assert_includes argv, "unix:/tmp/x.sock"
    assert_includes argv, "Connection: close"
  end

  def test_wrk_has_no_unix_sockets
    assert Wrk.new("wrk", "/bin/true").unsupported("unix", true)
    assert_nil Wrk.new("wrk", "/bin/true").unsupported("tcp", false)
  end

  def test_report_median_spread_ratios_and_absent_rows
    opts = BlackbuckBench.parse_options(%w[--servers unicorn,nginx,pitchfork --apps hello --transports unix --modes close --repeat 3])
    ms = [9_000.0, 10_000.0, 12_000.0].each_with_index.map do |rps, i|
      Measurement.new(server: "unicorn", app: "hello", transport: "unix", mode: "close", rep: i, status: "ok",
                      result: Result.new(requests: 100, rps: rps, p50_ms: 1.0, p99_ms: 2.0 + i, errors: 0, error_detail: {}),
                      cpu_us_per_req: 10.0, memory: { rss_kb_per_worker: 100, pss_kb_per_worker: 50, workers_seen: 2 })
    end
    ms << Measurement.new(server: "nginx", app: "hello", transport: "unix", mode: "close", rep: 0, status: "ok",
                          result: Result.new(requests: 100, rps: 40_000.0, errors: 0, error_detail: {}))
    ms << Measurement.new(server: "pitchfork", app: "hello", transport: "unix", mode: "close", rep: 0,
                          status: "absent", reason: "executable not found")
    report = Report.new(opts: opts, command: "test", machine: {}, driver: Drivers.build("wrk"), servers: {},
                        measurements: ms, crosscheck: [], started: Time.now, finished: Time.now)
    unicorn = report.rows.find { |r| r["server"] == "unicorn" }
    assert_equal 10_000.0, unicorn["rps"]
    assert_equal 30.0, unicorn["spread_pct"]
    assert_equal 3.0, unicorn["p99_ms"]
    assert_equal 0.25, unicorn["x_nginx"]
    assert_equal 1.0, unicorn["x_unicorn"]
    assert_equal "unicorn", unicorn["best_peer"], "nginx is the ceiling, not a peer; pitchfork is absent"
    assert_equal 1.0, unicorn["x_best"]
    assert_equal 4.0, report.rows.find { |r| r["server"] == "nginx" }["x_best"]
    pitchfork = report.rows.find { |r| r["server"] == "pitchfork" }
    assert_equal "absent", pitchfork["status"]
    assert_equal %w[unicorn nginx pitchfork], report.rows.map { |r| r["server"] }, "rows follow --servers order"
  end

  # --- blackbuck-load --target (mixed workloads) ---

  def target(path, requests, p50, p99, max, errors: {}, non2xx: 0, connections: 16)
    { "method" => "GET", "path" => path, "weight" => connections, "connections" => connections, "requests" => requests,
      "errors" => { "connect" => 0, "read" => 0, "write" => 0, "timeout" => 0, "status" => non2xx,
                    "connect_retry" => 0 }.merge(errors),
      "non_2xx_3xx" => non2xx,
      "latency_us" => { "count" => requests, "min" => 100, "mean" => p50, "stdev" => 1.0, "max" => max,
                        "percentiles" => { "50" => p50, "99" => p99, "100" => max }, "histogram" => [] } }
  end

  def test_targets_json_per_class_latency_and_errors
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "load.json"), JSON.generate(
        "schema_version" => 1, "runtime_s" => 2.0, "requests" => 2036, "requests_per_sec" => 1018.0,
        "errors" => { "timeout" => 1, "status" => 3 }, "latency_us" => { "percentiles" => { "50" => 20_000, "99" => 300_000 } },
        "targets" => [target("/fast", 2000, 20_639, 42_015, 148_192, errors: { "timeout" => 1 }, non2xx: 3),
                      target("/slow", 36, 312_319, 331_892, 331_892, connections: 2)]
      ))
      r = BlackbuckLoad.new("blackbuck-load", "/bin/true").parse("", dir)
      fast = r.classes["/fast"]
      assert_in_delta 20.639, fast["p50_ms"]
      assert_in_delta 42.015, fast["p99_ms"]
      assert_in_delta 148.192, fast["max_ms"]
      assert_in_delta 1000.0, fast["rps"]
      assert_equal 16, fast["connections"]
      assert_equal 4, fast["errors"], "timeout + non-2xx, and errors.status (the same non-2xx) not counted twice"
      assert_in_delta 331.892, r.classes["/slow"]["p99_ms"]
      assert_equal 0, r.classes["/slow"]["errors"]
    end
  end

  def test_targets_json_flat_percentile_keys
    r = BlackbuckLoad.new("blackbuck-load", "/bin/true")
    c = r.parse_targets([{ "path" => "/fast", "requests" => 10, "latency_us" => { "p50" => 1000, "p99" => 5000, "max" => 9000 } }], 1.0)
    assert_in_delta 5.0, c["/fast"]["p99_ms"]
    assert_in_delta 9.0, c["/fast"]["max_ms"]
    assert_nil r.parse_targets([], 1.0), "no targets array (a run without --target) => no classes"
  end

  def test_blackbuck_load_targets_command_pins_connections
    argv = BlackbuckLoad.new("blackbuck-load", "/bin/true").command(
      { transport: "unix", unix_path: "/tmp/x.sock" },
      { threads: 1, connections: 18, duration: 5, timeout: 5, targets: MIXED_TARGETS }, true, Dir.tmpdir
    )
    assert_equal ["--target", "GET /fast", "16", "--target", "GET /slow", "2", "--target-per-connection", "--seed", "1"],
                 argv[argv.index("--target"), 9]
    assert_equal "18", argv[argv.index("-c") + 1], "-c = sum of the weights: 16 fast + 2 slow connections"
  end

  def test_tools_without_targets_are_unsupported_for_mixed_loads
    wrk = Wrk.new("wrk", "/bin/true")
    e = assert_raises(Driver::Unsupported) do
      wrk.run({ transport: "tcp", tcp_port: 1 }, { threads: 1, connections: 1, duration: 1, timeout: 1, targets: MIXED_TARGETS },
              keepalive: true, scratch: Dir.tmpdir)
    end
    assert_match(/targets/, e.message)
  end

  # --- balance: requests per worker from the apps' BENCH_STATS_DIR files ---

  def test_balance_busiest_share_and_idle_worker
    before = { 11 => { "pid" => 11, "requests" => 100 }, 12 => { "pid" => 12, "requests" => 50 } }
    after = { 11 => { "pid" => 11, "requests" => 400 }, 12 => { "pid" => 12, "requests" => 150 },
              13 => { "pid" => 13, "requests" => 100 } } # a worker that first served during the run
    b = Stats.balance(before, after, 4)
    assert_equal [300, 100, 100], b["per_worker"]
    assert_equal 500, b["counted"]
    assert_equal 60.0, b["busiest_share_pct"]
    assert_equal 3, b["workers_serving"], "the fourth worker never served: it has no file, and counts as idle"
    assert_equal 4, b["workers"]

    one = Stats.balance(before, { 11 => { "requests" => 900 }, 12 => { "requests" => 50 } }, 2)
    assert_equal 100.0, one["busiest_share_pct"], "one worker did everything"
    assert_equal 1, one["workers_serving"]
    assert_nil Stats.balance(after, after, 2), "nothing counted (nginx, or no app counter) => no balance"
  end

  def test_stats_read_skips_half_written_and_foreign_files
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "11.json"), JSON.generate("pid" => 11, "requests" => 5, "yjit" => true, "rack" => "3.2.8",
                                                           "ruby" => "3.1.2", "server" => "puma 8.0.2"))
      File.write(File.join(dir, "12.json"), '{"pid": 12, "requ')
      File.write(File.join(dir, "11.json.tmp"), "{}")
      assert_equal [11], Stats.read(dir).keys
      assert_equal [{ "ruby" => "3.1.2", "yjit" => true, "rack" => "3.2.8", "server" => "puma 8.0.2" }], Stats.facts(dir)
    end
  end

  # --- the plan: workloads, subsets, the estimate against the 45-minute budget ---

  def all_present = ->(_name) { true }

  def test_full_run_fits_the_budget_even_with_every_peer_installed
    opts = BlackbuckBench.parse_options([], env: {})
    est = Plan.estimate(Plan.build(opts), opts, present: ->(name) { !name.start_with?("falcon") })
    throughput = est[:seconds] - est[:memory_seconds]
    assert_operator throughput, :<, Plan::FULL_RUN_BUDGET_S, Plan.describe(Plan.build(opts), opts)
    assert_operator throughput, :>, Plan::FULL_RUN_BUDGET_S / 3, "an estimate far below the budget means cells are missing"
    # the memory workload has a budget of its own (a Rails boot and a 6,000-request warm-up per row)
    assert_operator est[:memory_seconds], :<, Plan::MEMORY_BUDGET_S
    assert_operator est[:memory_seconds], :>, 0, "a full run includes the memory workload"
  end

  def test_estimate_counts_cells_runs_and_boots
    opts = BlackbuckBench.parse_options(%w[--servers blackbuck,unicorn,nginx --workloads hello_length,iowait --repeat 2
                                           --duration 2 --warmup 1 --no-crosscheck], env: {})
    steps = Plan.build(opts)
    est = Plan.estimate(steps, opts, present: all_present)
    # hello_length: 3 servers x 4 cells; iowait: 2 servers (no nginx) x 1 cell, 5 s
    assert_equal 3 * 4 + 2, est[:cells]
    assert_equal 2 * est[:cells], est[:measurements]
    assert_equal 5, est[:boots]
    expected = 12 * 2 * (2 + Plan::MEASURE_OVERHEAD_S) + 2 * 2 * (5 + Plan::MEASURE_OVERHEAD_S) + 5 * (Plan::BOOT_S + 1)
    assert_equal expected.round, est[:seconds]
    absent = Plan.estimate(steps, opts, present: ->(name) { name != "unicorn" })
    assert_equal 2 * 4 + 1, absent[:cells], "an absent server costs nothing"
    assert_equal 3, absent[:boots]
  end

  def test_estimate_of_an_h2load_workload_has_slack_and_a_rate_warmup
    opts = BlackbuckBench.parse_options(%w[--servers blackbuck --workloads iowait_burst --repeat 1 --warmup 0 --no-crosscheck], env: {})
    est = Plan.estimate(Plan.build(opts), opts, present: all_present)
    assert_equal (5 * 1.5 + Plan::MEASURE_OVERHEAD_S + Plan::BOOT_S + Plan::MIN_RATE_WARMUP_S).round, est[:seconds]
  end

  def test_quick_runs_every_peer_and_every_workload
    opts = BlackbuckBench.parse_options(%w[--quick], env: {})
    steps = Plan.build(opts)
    # all but the memory and streams workloads and their own rows (~30-40 s a row: too slow for CI)
    assert_equal WORKLOADS.reject { |w| w.memory? || w.streams? }.map(&:name).sort, steps.map { |s| s.workload.name }.sort
    # on 3.1: not the rows it cannot run (M:N threads), nor the threaded rows' YJIT twins
    expected = Servers.default_names.reject do |n|
      r = Servers.fetch(n)
      r.only || r.unfit_for(FakeRubies::DEBIAN_31) || (r.threaded? && r.yjit?)
    end
    assert_equal expected.sort, steps.flat_map(&:servers).uniq.sort
    assert steps.all? { |s| s.duration <= 1 }, "quick caps every workload's duration"
    est = Plan.estimate(steps, opts, present: ->(name) { !name.start_with?("falcon") })
    assert_operator est[:seconds], :<, 5 * 60, "bench:quick's hard cap"
  end

  def test_workload_servers_yjit_twins_nginx_and_subsets
    opts = BlackbuckBench.parse_options([], env: {})
    iowait = Plan.step(BlackbuckBench.workload("iowait"), opts)
    refute iowait.servers.include?("nginx"), "nginx serves no sleeping app"
    refute iowait.servers.any? { |s| s.end_with?("+yjit") }, "the app is a sleep: no YJIT twins"
    hello = Plan.step(BlackbuckBench.workload("hello_length"), opts)
    assert_includes hello.servers, "blackbuck+yjit"
    assert_includes hello.servers, "nginx"
    refute hello.servers.include?("puma5+yjit"), "the historical row has no default twin"
    mixed = Plan.step(BlackbuckBench.workload("mixed_nginx"), opts)
    assert_equal [4, 18], [mixed.workers, mixed.connections]
    refute mixed.servers.include?("nginx")

    only = BlackbuckBench.parse_options([], env: { "BENCH_ONLY" => "mixed" })
    assert_equal %w[mixed mixed_nginx], only[:workloads]
    named = BlackbuckBench.parse_options(%w[--servers iodine-2x1+yjit --workloads iowait], env: {})
    assert_equal ["iodine-2x1+yjit"], Plan.step(BlackbuckBench.workload("iowait"), named).servers, "named twins always run"
    assert_raises(OptionParser::InvalidArgument) { BlackbuckBench.parse_options([], env: { "BENCH_ONLY" => "nope" }) }
  end

  def test_yjit_twin_sets_the_environment_and_keeps_the_command
    base = Servers.fetch("puma8-2x5")
    twin = Servers.fetch("puma8-2x5+yjit")
    assert twin.yjit?
    refute base.yjit?
    assert_equal({ "RUBY_YJIT_ENABLE" => "1" }, twin.env)
    ctx = LaunchContext.new(app_name: "hello", app_path: "/x.ru", workers: 2, tcp_port: 1, unix_path: "/tmp/s", dir: Dir.mktmpdir)
    assert_equal base.command(ctx)[:argv], twin.command(ctx)[:argv]
    assert Servers.fetch("puma5+yjit").variant?, "the historical row's twin runs only when named"
  end

  # --- the report: per-class aggregation and ratios to the best peer ---

  def mixed_measurement(server, rep, rps, fast_p99, max, share)
    Measurement.new(server: server, app: "mixed", transport: "unix", mode: "keepalive", rep: rep, status: "ok",
                    result: Result.new(requests: 100, rps: rps, errors: 0, error_detail: {},
                                       classes: { "fast" => { "rps" => rps - 6, "p50_ms" => 5.0, "p99_ms" => fast_p99,
                                                              "max_ms" => max, "requests" => 90, "errors" => 0, "connections" => 16 },
                                                  "slow" => { "rps" => 6.0, "p50_ms" => 310.0, "p99_ms" => 330.0,
                                                              "max_ms" => 331.0, "requests" => 10, "errors" => 0, "connections" => 2 } }),
                    balance: { "busiest_share_pct" => share, "workers_serving" => 4, "per_worker" => [1] })
  end

  def test_report_mixed_classes_and_best_peer_ratios
    opts = BlackbuckBench.parse_options(%w[--servers blackbuck,unicorn,puma8-2x3 --workloads mixed --repeat 3], env: {})
    ms = [[600, 600.0, 9.0], [620, 630.0, 5.0], [610, 640.0, 12.0]].each_with_index.map { |(r, p, mx), i| mixed_measurement("blackbuck", i, r, p, mx, 30.0 + i) }
    ms += [[700, 23.0, 50.0], [720, 25.0, 60.0], [710, 21.0, 70.0]].each_with_index.map { |(r, p, mx), i| mixed_measurement("unicorn", i, r, p, mx, 26.0) }
    ms += [[2000, 40.0, 80.0]].each_with_index.map { |(r, p, mx), i| mixed_measurement("puma8-2x3", i, r, p, mx, 27.0) }
    report = Report.new(opts: opts, command: "test", machine: {}, driver: Drivers.build("wrk"), servers: {},
                        measurements: ms, crosscheck: [], started: Time.now, finished: Time.now,
                        plan: Plan.build(opts))
    bb = report.rows.find { |r| r["server"] == "blackbuck" }
    assert_equal 630.0, bb.dig("classes", "fast", "p99_ms"), "median of the runs' p99"
    assert_equal 12.0, bb.dig("classes", "fast", "max_ms"), "max = the largest of the runs' maxima"
    assert_equal 31.0, bb["busiest_share_pct"]
    assert_equal "puma8-2x3", bb["best_peer"], "best peer by req/s"
    assert_equal 0.31, bb["x_best"]
    assert_equal "unicorn", bb["best_peer_fast_p99"], "best peer by the fast class's p99 (lowest)"
    assert_equal 27.39, bb["fast_p99_x_best"]
    assert_equal 1.0, report.rows.find { |r| r["server"] == "unicorn" }["fast_p99_x_best"]
    md = report.send(:markdown)
    assert_match(/\| blackbuck \| unix keep-alive \| 610 \| 604 \| 5\.00 \| 630\.00 \| 12\.0 \|/, md)
  end

  def test_readme_block_gets_every_workload_table
    opts = BlackbuckBench.parse_options(%w[--servers blackbuck,unicorn --workloads mixed,hello_length --repeat 1], env: {})
    ms = [mixed_measurement("blackbuck", 0, 600, 630.0, 640.0, 40.0), mixed_measurement("unicorn", 0, 700, 23.0, 30.0, 26.0)]
    ms << Measurement.new(server: "unicorn", app: "hello_length", transport: "unix", mode: "close", rep: 0, status: "ok",
                          result: Result.new(requests: 100, rps: 9000.0, errors: 0, error_detail: {}))
    report = Report.new(opts: opts, command: "test", machine: {}, driver: Drivers.build("wrk"), servers: {},
                        measurements: ms, crosscheck: [], started: Time.now, finished: Time.now, plan: Plan.build(opts))
    Dir.mktmpdir do |dir|
      readme = File.join(dir, "README.md")
      File.write(readme, "intro\n#{Report::README_BEGIN}\nold table\n#{Report::README_END}\nafter\n")
      report.send(:update_readme, File.join(dir, "none.png"), readme)
      text = File.read(readme)
      assert_match(/\Aintro\n#{Regexp.escape(Report::README_BEGIN)}\n_Generated/, text)
      assert_match(/### mixed — .*\| blackbuck \| unix keep-alive \| 600 \|.*### hello_length — .*\| unicorn \| unix \| conn\/request \| 9,000 \|/m, text)
      assert text.end_with?("#{Report::README_END}\nafter\n")
      refute_includes text, "old table"
      refute_includes text, Report::TABLES_BEGIN, "the markers of latest.md stay out of the README"
    end
  end
end

# A server's port is picked below the kernel's ephemeral range, so no connect(2) or bind(0) of
# another program takes it between the pick and the server's bind; a port a server holds is not
# picked.
class FreePortTest < Minitest::Test
  include BlackbuckBench::Local

  def test_ports_are_below_the_ephemeral_range_and_free
    low = Integer(File.read("/proc/sys/net/ipv4/ip_local_port_range").split.first, 10)
    held = Array.new(3) { free_port }.map { |port| TCPServer.new("127.0.0.1", port) }
    ports = held.map { |s| s.addr[1] }
    assert(ports.all? { |port| port < low && port >= low - PORT_SPAN }, "#{ports} below #{low}")
    20.times { refute_includes ports, free_port }
  ensure
    held&.each(&:close)
  end
end
