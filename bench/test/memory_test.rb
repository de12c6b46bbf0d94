# frozen_string_literal: true

# The memory workload's arithmetic: smaps_rollup parsing, a tree's summary, the issue's targets,
# the page groups and the combined load result, the plan; no servers, no load.
# Run: ruby bench/test/memory_test.rb   (or rake bench:test)
require "minitest/autorun"
require_relative "fake_rubies"
require "tmpdir"
require_relative "../lib/blackbuck_bench/runner"

class MemoryTest < Minitest::Test
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

  # Linux 6.x, a forked Rails worker (fields the kernel prints, in its order)
  ROLLUP = <<~OUT
    55f1c2a4e000-7ffd8b7f2000 ---p 00000000 00:00 0                          [rollup]
    Rss:              112340 kB
    Pss:               70412 kB
    Pss_Dirty:         52100 kB
    Pss_Anon:          50000 kB
    Pss_File:          20412 kB
    Pss_Shmem:             0 kB
    Shared_Clean:      38000 kB
    Shared_Dirty:      12000 kB
    Private_Clean:      2340 kB
    Private_Dirty:     60000 kB
    Referenced:       110000 kB
    Anonymous:         98000 kB
    LazyFree:              0 kB
    AnonHugePages:         0 kB
    ShmemPmdMapped:        0 kB
    FilePmdMapped:         0 kB
    Shared_Hugetlb:        0 kB
    Private_Hugetlb:       0 kB
    Swap:                  0 kB
    SwapPss:               0 kB
    Locked:                0 kB
  OUT

  def test_parse_smaps_rollup
    f = Memory.parse_smaps(ROLLUP)
    assert_equal 112_340, f["Rss"]
    assert_equal 70_412, f["Pss"]
    assert_equal 60_000, f["Private_Dirty"]
    refute f.key?("55f1c2a4e000-7ffd8b7f2000"), "the header line is not a field"
    p = Memory.proc_from_smaps(7, "worker", "blackbuck worker 1", f)
    assert_equal 62_340, p.uss_kb
    assert_equal 50_000, p.shared_kb
    assert_in_delta 44.5, p.shared_pct, 0.05
  end

  def test_parse_smaps_of_a_kernel_without_some_fields
    p = Memory.proc_from_smaps(7, "worker", "x", Memory.parse_smaps("Rss: 10 kB\nPss: 8 kB\nPrivate_Dirty: 6 kB\n"))
    assert_equal 6, p.uss_kb
    assert_equal 0, p.shared_kb
    assert_in_delta 0.0, Memory.proc_from_smaps(1, "other", "x", {}).shared_pct
  end

  def mk(pid, role, rss, pss, uss, shared, age_s = 10.0 - pid * 2.5)
    Memory::Proc.new(pid: pid, role: role, title: "t#{pid}", rss_kb: rss, pss_kb: pss, uss_kb: uss, shared_kb: shared, age_s: age_s)
  end

  def test_summary_counts_workers_for_per_worker_figures_and_every_process_for_total_pss
    procs = [mk(1, "master", 100_000, 40_000, 10_000, 90_000),
             mk(2, "worker", 100_000, 50_000, 20_000, 80_000),
             mk(3, "worker", 100_000, 70_000, 40_000, 60_000),
             mk(4, "other", 100_000, 30_000, 5_000, 95_000)] # a mold
    s = Memory.summarize(procs)
    assert_equal 2, s["workers_seen"]
    assert_equal 30_000, s["uss_kb_per_worker"]
    assert_equal 20_000, s["uss_kb_min"]
    assert_equal 40_000, s["uss_kb_max"]
    assert_equal 60_000, s["pss_kb_per_worker"]
    assert_in_delta 70.0, s["shared_pct_per_worker"]
    assert_equal 190_000, s["total_pss_kb"]
    assert_in_delta 2.5, s["youngest_worker_age_s"]
    assert_equal 4, s["processes"].size
    assert_equal "other", s["processes"].last["role"]
  end

  def test_summary_without_workers
    s = Memory.summarize([mk(1, "master", 10, 10, 10, 0)])
    assert_nil s["uss_kb_per_worker"]
    assert_nil s["shared_pct_per_worker"]
    assert_equal 10, s["total_pss_kb"]
  end

  def test_sample_reads_this_process_tree
    procs = Memory.sample(Process.pid, nil)
    me = procs.find { |p| p.pid == Process.pid }
    assert_equal "master", me.role
    assert_operator me.rss_kb, :>, 0
    assert_operator me.uss_kb, :<=, me.rss_kb
    assert_operator me.age_s, :>=, 0
    assert_operator me.age_s, :<, Process.clock_gettime(Process::CLOCK_MONOTONIC), "younger than the machine"
  end

  def summaries(**uss_and_pss)
    uss_and_pss.to_h { |name, (uss, pss)| [name.to_s, { "uss_kb_per_worker" => uss, "total_pss_kb" => pss }] }
  end

  def test_targets_pass_fail_and_missing
    s = summaries("blackbuck-refork": [40_000, 0], "pitchfork-refork": [50_000, 300_000],
                  "blackbuck-warmup-refork-jemalloc": [33_000, 230_000], "pitchfork-refork-jemalloc": [45_000, 280_000],
                  "blackbuck-defaults": [65_000, 0], "unicorn-preload": [64_000, 0],
                  "blackbuck-warmup-refork": [32_000, 300_000])
    t = Memory.evaluate(s).to_h { |x| [x["label"], x] }
    refork = t["reforking alone: USS per worker (glibc, both)"]
    assert_in_delta 0.8, refork["ratio"]
    assert refork["pass"], "0.8 is within <= 0.8x"
    uss = t["warmup + refork: USS per worker (glibc, both)"]
    assert_in_delta 0.64, uss["ratio"]
    assert uss["pass"]
    assert_equal false, t["warmup + refork: total PSS (glibc, both)"]["pass"], "300,000 / 300,000 > 0.8"
    jemalloc = t["warmup + refork: USS per worker (jemalloc, both)"]
    assert_equal %w[blackbuck-warmup-refork-jemalloc pitchfork-refork-jemalloc], [jemalloc["server"], jemalloc["base"]]
    assert_in_delta 0.733, jemalloc["ratio"], 0.001
    assert_equal false, jemalloc["pass"]
    assert_in_delta 0.821, t["warmup + refork: total PSS (jemalloc, both)"]["ratio"], 0.001
    defaults = t["defaults: USS per worker (glibc, both)"]
    assert_equal false, defaults["pass"], "65,000 > 64,000: more than Unicorn's"
    yjit = t["warmup + refork, YJIT: total PSS (jemalloc, both)"]
    assert_nil yjit["pass"]
    assert_equal "blackbuck-warmup-refork-jemalloc+yjit and pitchfork-refork-jemalloc+yjit", yjit["missing"]
    across = t["(comparison) warmup + refork + jemalloc against Pitchfork on glibc: USS per worker"]
    assert_in_delta 0.66, across["ratio"]
    assert_nil across["pass"], "a comparison has no limit to pass or fail"
    assert_nil across["missing"]
  end

  # issue 34: every limit with the same allocator on both sides, glibc and jemalloc
  def test_every_limit_is_checked_on_glibc_and_on_jemalloc_alike
    limited = Memory::TARGETS.select(&:limit)
    assert_equal Memory::LIMITS.size * 2, limited.size
    limited.each do |t|
      assert_equal t.server.include?("jemalloc"), t.base.include?("jemalloc"), "#{t.label}: one allocator on both sides"
      yjit = t.server[/\+yjit\d*\z/]
      yjit ? assert_equal(yjit, t.base[/\+yjit\d*\z/], "#{t.label}: YJIT alike") : assert_nil(t.base[/\+yjit/], t.label)
    end
    assert_equal "pitchfork-refork-jemalloc+yjit", Memory.on_jemalloc("pitchfork-refork+yjit")
    assert_equal "blackbuck-defaults-jemalloc", Memory.on_jemalloc("blackbuck-defaults")
  end

  def test_targets_name_rows_that_exist
    names = Servers.names
    Memory::TARGETS.each do |t|
      assert_includes names, t.server
      assert_includes names, t.base
    end
  end

  def test_pages_in_groups_the_load_tool_takes
    groups = MemoryStep.target_groups
    assert_equal 90, MemoryRailsApp.endpoints.size
    assert_equal MemoryRailsApp.endpoints, groups.flatten.map { |t| t["path"] }
    assert(groups.all? { |g| g.size <= MemoryStep::TOOL_MAX_TARGETS })
    assert_equal [45, 45], groups.map(&:size)
    assert_equal [44, 44, 42], MemoryStep.target_groups(Array.new(130) { |i| "/#{i}" }).map(&:size)
  end

  def test_combined_load_result_is_all_requests_over_all_seconds
    a = Result.new(requests: 600, seconds: 2.0, rps: 300.0, p50_ms: 10.0, p99_ms: 50.0, errors: 1,
                   error_detail: { "status" => 1 }, command: "a")
    b = Result.new(requests: 300, seconds: 1.0, rps: 300.0, p50_ms: 12.0, p99_ms: 40.0, errors: 2,
                   error_detail: { "status" => 1, "timeout" => 1 }, command: "b")
    r = MemoryStep.combine([a, b])
    assert_equal 900, r.requests
    assert_in_delta 300.0, r.rps
    assert_in_delta 12.0, r.p50_ms
    assert_in_delta 50.0, r.p99_ms
    assert_equal 3, r.errors
    assert_equal({ "status" => 2, "timeout" => 1 }, r.error_detail)
  end

  def test_memory_rows_run_only_in_the_memory_workload_and_not_in_quick
    opts = BlackbuckBench.parse_options([], env: {})
    steps = Plan.build(opts)
    memory = steps.find { |s| s.workload.memory? }
    assert(memory.servers.all? { |n| Servers.fetch(n).only == "memory" })
    assert_includes memory.servers, "blackbuck-warmup-refork+yjit64"
    assert((steps - [memory]).none? { |s| s.servers.any? { |n| Servers.fetch(n).only == "memory" } })
    quick = BlackbuckBench.parse_options(["--quick"], env: {})
    assert(Plan.build(quick).none? { |s| s.workload.memory? })
  end

  def test_yjit_rows_write_out_the_code_region_size
    assert_equal "--yjit --yjit-exec-mem-size=256", Servers.fetch("pitchfork-refork+yjit").env["RUBYOPT"]
    assert_equal "--yjit --yjit-exec-mem-size=64", Servers.fetch("blackbuck-warmup-refork+yjit64").env["RUBYOPT"]
    assert_nil Servers.fetch("blackbuck-defaults-jemalloc").env["RUBYOPT"]
  end

  def test_report_has_a_memory_table_and_targets
    Dir.mktmpdir { |dir| check_memory_report(dir) }
  end

  def check_memory_report(dir)
    # --out: a report written to bench/results would rewrite bench/README.md's last full run
    opts = BlackbuckBench.parse_options(%W[--workloads memory --servers blackbuck-refork,pitchfork-refork,blackbuck-warmup
                                           --no-crosscheck --out #{dir}], env: {})
    steps = Plan.build(opts)
    mem = ->(uss, pss) { Memory.summarize([mk(1, "master", 9, pss - uss * 2, 1, 8), mk(2, "worker", 9, uss, uss, 0), mk(3, "worker", 9, uss, uss, 0)]) }
    ok = lambda do |server, uss, pss|
      Measurement.new(server: server, app: "memory", transport: "unix", mode: "keepalive", rep: 0, status: "ok",
                      result: Result.new(requests: 1000, seconds: 5.0, rps: 200.0, errors: 0, error_detail: {}),
                      memory: { smaps: mem.call(uss, pss), ruby_opts: nil,
                                warm: { "requests" => 6000, "errors" => 0, "top_ups" => 2, "youngest_worker_served_s" => 3.4 } })
    end
    failed = Measurement.new(server: "blackbuck-warmup", app: "memory", transport: "unix", mode: "keepalive", rep: 0,
                             status: "failed", reason: "boot: exited during boot; log tail: unknown directive warmup")
    report = Report.new(opts: opts, command: "test", machine: { "cpu" => "x", "cores" => 2 }, driver: Drivers.build("blackbuck-load"),
                        servers: {}, measurements: [ok.call("blackbuck-refork", 40_000, 200_000),
                                                    ok.call("pitchfork-refork", 50_000, 300_000), failed],
                        crosscheck: [], started: Time.now, finished: Time.now, plan: steps)
    FileUtils.mkdir_p(File.join(dir, "scratch"))
    report.write(dir, File.join(dir, "scratch"))
    md = File.read(File.join(dir, "latest.md"))
    assert_match(/\| blackbuck-refork \| 40,000 \| 40,000–40,000 \| .* \| 6,000 \| 3\.4 \(2\) \| 0 \| – \|/, md)
    assert_match(/\| blackbuck-warmup \| \*\*failed\*\* \| boot: exited during boot; log tail: unknown directive warmup/, md)
    assert_match(/\| reforking alone: USS per worker \(glibc, both\) \| blackbuck-refork \| pitchfork-refork \| uss_kb_per_worker \| 0\.80 \| ≤ 0\.8 \| \*\*pass\*\* \|/, md)
    assert_match(/defaults: USS per worker \(glibc, both\) .* n\/a \(blackbuck-defaults and unicorn-preload not measured\)/, md)
    assert_match(/\| \(comparison\) warmup \+ refork \+ jemalloc against Pitchfork on glibc: USS per worker .* \| – \| n\/a \(blackbuck-warmup-refork-jemalloc not measured\) \|/, md)
    assert_equal Memory::TARGETS.size, report.document["memory_targets"].size
  end
end
