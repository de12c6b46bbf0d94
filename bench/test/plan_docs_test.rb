# frozen_string_literal: true

# What the harness says about a run before and after it (issue 32, item 14): --quick's help names
# the workloads its plan runs, a cell measured once has no spread, --plan prints the plan and
# measures nothing, and bench/README.md's subset between bench:quick and the full run reproduces
# tables of README.md within its stated time. No servers, no load.
# Run: ruby bench/test/plan_docs_test.rb   (or rake bench:test)
require "minitest/autorun"
require_relative "fake_rubies"
require "open3"
require "rbconfig"
require "tmpdir"
require_relative "../lib/blackbuck_bench/runner"

class PlanDocsTest < Minitest::Test
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

  BENCH = File.expand_path("..", __dir__)
  ROOT = File.expand_path("..", BENCH)
  QUICK_CAP_S = 5 * 60 # bench:quick's bound (drivers_test.rb): a subset worth documenting measures more

  def run_bench(*args) = Open3.capture3(RbConfig.ruby, File.join(BENCH, "run.rb"), *args, chdir: ROOT)

  def test_quick_help_names_the_workloads_quick_runs
    out, _err, status = run_bench("--help")
    assert status.success?
    named = out[/--quick .*workloads=(\S+),/, 1].split(",")
    opts = BlackbuckBench.parse_options(%w[--quick], env: {})
    assert_equal Plan.build(opts).map { |s| s.workload.name }, named
    refute_includes named, "memory"
  end

  def test_a_cell_measured_once_has_no_spread
    opts = BlackbuckBench.parse_options(%w[--servers unicorn --apps hello --transports unix --modes close --repeat 1], env: {})
    ms = [Measurement.new(server: "unicorn", app: "hello", transport: "unix", mode: "close", rep: 0, status: "ok",
                          result: Result.new(requests: 100, rps: 9_000.0, p50_ms: 1.0, p99_ms: 2.0, errors: 0, error_detail: {}))]
    report = Report.new(opts: opts, command: "test", machine: {}, driver: Drivers.build("wrk"), servers: {},
                        measurements: ms, crosscheck: [], started: Time.now, finished: Time.now)
    row = report.rows.first
    assert_equal [1, nil], [row["runs"], row["spread_pct"]]
    assert_match(/\| unicorn \| unix \| conn\/request \| 9,000 \| n\/a \|/, report.send(:plain_table, report.rows))
  end

  def test_plan_prints_the_plan_and_measures_nothing
    Dir.mktmpdir do |dir|
      out, err, status = run_bench("--only", "mixed", "--plan", "--out", "#{dir}/out")
      assert status.success?, err
      assert_match(/\Aplan: servers on .*\nplan: \d+ cells x 3 runs = \d+ measurements, \d+ boots; estimate [\d.]+ min\n  mixed: .*\n  mixed_nginx: /, out)
      refute File.exist?("#{dir}/out"), "nothing written"
    end
  end

  def test_the_documented_subset_reproduces_readme_tables_between_quick_and_full
    doc = File.read(File.join(BENCH, "README.md"))
    name = doc[/^BENCH_ONLY=(\w+) BENCH_ARGS="--out tmp\/bench-\w+" bundle exec rake bench/, 1]
    refute_nil name, "bench/README.md shows the subset's command"
    every_peer = ->(server) { !server.start_with?("falcon") } # as the last full run had them
    subset = BlackbuckBench.parse_options(["--only", name], env: {})
    full = BlackbuckBench.parse_options([], env: {})
    seconds = Plan.estimate(Plan.build(subset), subset, present: every_peer)[:seconds]
    full_seconds = Plan.estimate(Plan.build(full), full, present: every_peer)[:seconds]
    assert_operator seconds, :>, QUICK_CAP_S
    assert_operator seconds, :<, full_seconds / 3, "well short of the full run"
    stated = "estimated at #{(seconds / 60.0).round} minutes with every peer"
    assert doc.include?(stated), "bench/README.md states the time: #{stated}"
    assert_equal full[:repeat], subset[:repeat], "the full run's repetitions, so its figures compare"
    readme = File.read(File.join(ROOT, "README.md"))
    Plan.build(subset).each do |step|
      table = "### #{step.workload.name} — #{step.workload.title}\n"
      assert readme.include?(table), "README.md has the table #{name} reproduces: #{table}"
    end
  end
end
