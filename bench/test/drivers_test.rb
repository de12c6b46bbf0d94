# frozen_string_literal: true

# Parsers of the load tools' outputs, and the report's aggregation: no servers, no load.
# Run: ruby bench/test/drivers_test.rb   (or rake bench:test)
require "minitest/autorun"
require "tmpdir"
require_relative "../lib/blackbuck_bench/runner"

class DriversTest < Minitest::Test
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
    assert_nil unicorn["x_puma"]
    pitchfork = report.rows.find { |r| r["server"] == "pitchfork" }
    assert_equal "absent", pitchfork["status"]
    assert_equal %w[unicorn nginx pitchfork], report.rows.map { |r| r["server"] }, "rows follow --servers order"
  end
end
