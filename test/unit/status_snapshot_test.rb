# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# The status pages' numbers without a listener or workers: a real scoreboard filled as workers
# would fill it, StatusSnapshot reading it, StatusMetrics rendering what it read.
class StatusSnapshotTest < Minitest::Test
  Child = Blackbuck::Children::Child
  BUSY = Blackbuck::Native::Scoreboard::BUSY

  def setup
    @board = Blackbuck::Native::Scoreboard.new(4)
    @counts = Blackbuck::RequestCounts.new(@board)
    @children = [Child.new(1, 101, nil, 0.0, false), Child.new(0, 100, nil, 0.0, true)]
    @snapshot = Blackbuck::StatusSnapshot.new(children: @children, request_counts: @counts, scoreboard: @board,
                                              listeners: [])
    @board.reset(0, 100) # worker 0 is in its loop; worker 1 has not taken its slot yet
    3.times { @board.request_observed(0, 0.001, 0.002) }
  end

  def test_each_worker_by_slot_and_the_totals
    snap = @snapshot.take
    assert_equal Process.pid, snap["pid"]
    assert_equal [0, 1], snap["workers"].map { |w| w["index"] }
    first, second = snap["workers"]
    assert_equal %w[idle starting], [first["state"], second["state"]]
    assert_equal 100, first["pid"]
    assert_equal 0, second["requests"]
    assert_nil second["heartbeat_age_ms"]
    assert_equal({ "workers" => 2, "busy" => 0, "idle" => 1 }, snap["totals"].slice("workers", "busy", "idle"))
    assert_equal 3, snap["recent"]["requests"]
    refute_nil first["queue_time"]["p50"]
  end

  def test_a_running_request_is_busy_with_what_runs
    @board.running(0, BUSY, 1.5, "POST", "/upload")
    first = @snapshot.take["workers"].first
    assert_equal ["busy", "POST", "/upload"], first.values_at("state", "method", "path")
    assert_operator first["running_ms"], :>=, 1500
  end

  def test_metrics_render_the_snapshot_as_prometheus_text
    snap = @snapshot.take
    text = Blackbuck::StatusMetrics.text(snap, @snapshot.histograms(snap))
    assert_includes text, "# HELP blackbuck_workers Worker processes.\n# TYPE blackbuck_workers gauge\nblackbuck_workers 2\n"
    assert_includes text, "# TYPE blackbuck_request_duration_seconds histogram\n"
    assert_includes text, %(blackbuck_request_duration_seconds_bucket{le="+Inf"} 3\n)
    assert_includes text, "blackbuck_request_duration_seconds_count 3\n"
    assert_match(/^blackbuck_worker_queue_seconds\{worker="0",quantile="0\.5"\} [\d.e-]+$/, text)
    refute_match(/worker_queue_seconds\{worker="1"/, text, "a worker still starting has no queue times yet")
    buckets = text.scan(/^blackbuck_request_queue_seconds_bucket\{le="[^"]+"\} (\d+)$/).flatten.map(&:to_i)
    assert_equal buckets.sort, buckets, "cumulative"
  end

  # Issue 32, item 10: what /status has, /metrics has too, from the same snapshot.
  def test_metrics_have_memory_per_role_refork_generation_worker_exits_and_build_info
    exits = Blackbuck::WorkerExits.new(@board)
    snapshot = Blackbuck::StatusSnapshot.new(children: @children, request_counts: @counts, scoreboard: @board,
                                             listeners: [], exits: exits)
    exits.exited(@children.last, Struct.new(:success?).new(false))
    snap = snapshot.take
    text = Blackbuck::StatusMetrics.text(snap, snapshot.histograms(snap))
    assert_equal 1, snap["worker_exits"]["crash"]
    assert_includes text, %(blackbuck_worker_exits_total{reason="crash"} 1\n)
    assert_includes text, %(blackbuck_worker_exits_total{reason="ttou"} 0\n)
    assert_includes text, "# TYPE blackbuck_worker_exits_total counter\n"
    assert_includes text, %(blackbuck_build_info{version="#{Blackbuck::VERSION}",ruby="#{RUBY_VERSION}"} 1\n)
    assert_includes text, "blackbuck_refork_generation 0\n"
    master = snap["processes"].find { |p| p["role"] == "master" }
    assert_includes text, %(blackbuck_memory_uss_bytes{role="master"} #{master['uss_kib'] * 1024}\n)
    assert_includes text, %(blackbuck_memory_pss_bytes{role="master"} #{master['pss_kib'] * 1024}\n)
    refute_match(/role="mold"/, text, "no mold, no sample")
  end

  def test_label_values_are_escaped
    assert_equal %({listener="a\\"b\\\\c\\nd",worker="0"}),
                 Blackbuck::StatusMetrics.labels_text({ "listener" => "a\"b\\c\nd", "worker" => 0 })
    assert_equal "", Blackbuck::StatusMetrics.labels_text({})
  end
end
