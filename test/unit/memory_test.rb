# frozen_string_literal: true

require "minitest/autorun"
require "tmpdir"
require "fileutils"
require "open3"
require "json"
require_relative "../../lib/blackbuck/memory"

# Memory#over_limit reads statm (RSS) and, only when RSS is over max_memory_per_child,
# smaps_rollup (USS). Here both are fakes in a tmpdir, so a test can make one disagree with the
# other and see which was read.
class MemoryTest < Minitest::Test
  LIMIT = 100_000 # KiB

  def setup
    @proc = Dir.mktmpdir("bb-proc")
  end

  def teardown
    FileUtils.rm_rf(@proc)
  end

  def rss(kib) = File.write("#{@proc}/statm", "999999 #{kib / Blackbuck::Memory::PAGE_KIB} 0 0 0 0 0\n")

  def uss(clean, dirty = 0)
    File.write("#{@proc}/smaps_rollup", <<~ROLLUP)
      55a380330000-7ffd80844000 ---p 00000000 00:00 0                          [rollup]
      Rss:              200000 kB
      Shared_Clean:       1464 kB
      Shared_Dirty:     150000 kB
      Private_Clean:    #{clean} kB
      Private_Dirty:    #{dirty} kB
    ROLLUP
  end

  def memory(limit = LIMIT) = Blackbuck::Memory.new({ oob_gc: 0, oob_gc_auto: false, max_memory_per_child: limit }, proc: @proc)

  def test_uss_is_private_clean_plus_private_dirty
    rss(200_000)
    uss(30_000, 80_000)
    m = memory
    assert_equal :uss, m.measure
    assert_equal 110_000, m.over_limit(0.0)
  end

  def test_a_worker_over_by_rss_but_not_by_uss_is_under
    rss(200_000)
    uss(1_000, 20_000)
    assert_nil memory.over_limit(0.0)
  end

  # USS <= RSS, so under the limit by RSS smaps_rollup is not read at all: a fake one that says
  # otherwise (impossible for real) is not believed.
  def test_under_by_rss_smaps_rollup_is_not_read
    rss(90_000)
    uss(0, 500_000)
    assert_nil memory.over_limit(0.0)
  end

  # After a USS read under the limit, the next one waits until RSS has grown past the headroom
  # left (a leak) or until the cost budget has paid for one (copy-on-write drift).
  def test_uss_is_read_again_on_growth_past_the_headroom_or_after_a_while
    rss(200_000)
    uss(0, 90_000) # 10,000 KiB of headroom
    m = memory
    assert_nil m.over_limit(0.0)
    uss(0, 150_000) # changed behind its back: not read yet
    rss(209_000)
    assert_nil m.over_limit(0.0), "RSS grew less than the headroom: USS is not read again yet"
    rss(211_000)
    assert_equal 150_000, m.over_limit(0.0), "RSS grew past the headroom: USS is read again"

    m = memory
    rss(200_000)
    uss(0, 90_000)
    assert_nil m.over_limit(0.0)
    uss(0, 150_000) # pages that turned private, RSS unchanged
    assert_nil m.over_limit(0.0)
    assert_equal 150_000, m.over_limit(60.0), "USS is read again after a while even if RSS stays"
  end

  def test_without_smaps_rollup_rss_is_counted
    rss(120_000)
    m = memory
    assert_equal :rss, m.measure
    assert_equal 120_000, m.over_limit(0.0)
    assert_match(/of RSS \(no smaps_rollup here/, Blackbuck::Memory.describe(LIMIT, @proc))
  end

  def test_smaps_rollup_gone_after_the_start_falls_back_to_rss
    rss(120_000)
    uss(1_000)
    m = memory
    File.delete("#{@proc}/smaps_rollup")
    assert_equal 120_000, m.over_limit(0.0)
    assert_equal :rss, m.measure
  end

  def test_without_proc_the_limit_is_off
    m = memory
    assert_nil m.measure
    assert_equal 0, m.limit_kib
    refute m.per_request?
    assert_match(/not enforced/, Blackbuck::Memory.describe(LIMIT, @proc))
  end

  def test_describe_names_uss
    rss(1)
    uss(1)
    assert_equal "max_memory_per_child 100000 KiB of USS (a worker's private pages, from smaps_rollup)",
                 Blackbuck::Memory.describe(LIMIT, @proc)
  end

  def test_check_is_due_check_seconds_apart
    rss(1)
    m = memory
    assert m.check_due?(5.0)
    m.over_limit(5.0)
    refute m.check_due?(5.0 + (Blackbuck::Memory::CHECK_SECONDS / 2))
    assert m.check_due?(5.0 + Blackbuck::Memory::CHECK_SECONDS)
  end
end

# oob_major_gc (Ruby >= 3.4): the worker's GC runs no major collection by itself; Memory turns that
# on and off (#start, #stop), says a GC is due when Ruby flags a major (need_major_by), runs it as a
# major between requests, and lets Ruby's own majors back when one waits too long. The decisions
# against a stand-in GC; one test against this Ruby's own.
class MemoryMajorGCTest < Minitest::Test
  Memory = Blackbuck::Memory

  # What Memory asks of GC, with a need_major_by and a major count a test sets, and a record of
  # what Memory told it.
  class StandInGC
    attr_accessor :need, :majors
    attr_reader :full_marks, :starts, :asked

    def initialize
      @need = nil
      @majors = 0
      @full_marks = true
      @starts = []
      @asked = 0
    end

    def config(hash = nil)
      @full_marks = hash.fetch(:rgengc_allow_full_mark) if hash
      { rgengc_allow_full_mark: @full_marks, implementation: "default" }
    end

    def latest_gc_info(key = nil)
      @asked += 1
      key ? { need_major_by: @need }.fetch(key) : { need_major_by: @need }
    end

    def stat(key) = { major_gc_count: @majors, malloc_increase_bytes: 0, malloc_increase_bytes_limit: 1 }.fetch(key)

    # A full GC is a major: it runs and clears the flag.
    def start(full_mark:, immediate_sweep:)
      @starts << [full_mark, immediate_sweep]
      return unless full_mark

      @majors += 1
      @need = nil
    end
  end

  def setup
    @gc = StandInGC.new
    @now = 100.0
  end

  def memory(major: true, oob_gc: 0, auto: false)
    Memory.new({ oob_gc: oob_gc, oob_gc_auto: auto, oob_major_gc: major, max_memory_per_child: 0 },
               proc: "/nonexistent", gc: @gc, clock: -> { @now })
  end

  def test_start_turns_ruby_own_major_gcs_off_and_stop_back_on
    m = memory
    assert m.per_request?
    m.start
    refute @gc.full_marks, "in the worker, before its first request: no major GC by Ruby itself"
    m.stop
    assert @gc.full_marks, "once the loop is done (and in the mold it may fork): Ruby's own again"
  end

  def test_without_the_setting_nothing_changes
    m = memory(major: false)
    refute m.per_request?
    m.start
    assert @gc.full_marks
    @gc.need = :oldgen
    refute m.gc_due?(1), "need_major_by is not looked at"
    assert_equal 0, @gc.asked
  end

  def test_a_major_flagged_by_ruby_is_due_and_collect_runs_it_as_a_major
    m = memory
    m.start
    refute m.gc_due?(1), "nothing flagged"
    @gc.need = :oldgen
    assert m.gc_due?(2), "need_major_by set: a GC is due between requests"
    m.collect
    assert_equal [[true, true]], @gc.starts, "a major, swept at once (not in the next requests)"
    refute m.gc_due?(3), "done: nothing due"
    refute @gc.full_marks, "Ruby's own majors stay off"
  end

  def test_with_oob_gc_auto_the_gc_between_requests_is_a_major_only_when_one_is_flagged
    m = memory(auto: true)
    m.collect
    @gc.need = :nofree
    m.collect
    assert_equal [[false, false], [true, true]], @gc.starts
  end

  # A worker that never has an idle moment (a request always waits) never runs #collect: after
  # OOB_MAJOR_GC_WAIT_REQUESTS requests Ruby may run its own major (its next GC), and once one has
  # run its majors are off again.
  def test_a_major_that_waits_too_many_requests_is_left_to_ruby_until_one_has_run
    m = memory
    m.start
    @gc.need = :oldmalloc
    first = 10
    (first...(first + Memory::OOB_MAJOR_GC_WAIT_REQUESTS)).each do |served|
      assert m.gc_due?(served)
      refute @gc.full_marks, "request #{served}: still waiting for an idle moment"
    end
    assert m.gc_due?(first + Memory::OOB_MAJOR_GC_WAIT_REQUESTS), "still due: an idle moment may yet come first"
    assert @gc.full_marks, "waited #{Memory::OOB_MAJOR_GC_WAIT_REQUESTS} requests: Ruby's own majors are allowed"
    assert m.gc_due?(first + Memory::OOB_MAJOR_GC_WAIT_REQUESTS + 1)
    assert @gc.full_marks, "until a major has run"
    @gc.majors += 1 # Ruby's next GC was the major, inside a request
    @gc.need = nil
    refute m.gc_due?(first + Memory::OOB_MAJOR_GC_WAIT_REQUESTS + 2)
    refute @gc.full_marks, "a major ran: Ruby's own are off again"
  end

  def test_a_major_that_waits_too_long_is_left_to_ruby
    m = memory
    m.start
    @gc.need = :shady
    assert m.gc_due?(1)
    @now += Memory::OOB_MAJOR_GC_WAIT_SECONDS - 0.1
    assert m.gc_due?(2)
    refute @gc.full_marks
    @now += 0.1
    assert m.gc_due?(3)
    assert @gc.full_marks, "flagged #{Memory::OOB_MAJOR_GC_WAIT_SECONDS} s ago and not run: Ruby's own majors are allowed"
    # an idle moment comes after all: #collect's major counts as the one that ran
    m.collect
    refute m.gc_due?(4)
    refute @gc.full_marks
  end

  def test_the_wait_starts_again_with_each_flag
    m = memory
    m.start
    @gc.need = :oldgen
    assert m.gc_due?(1)
    m.collect # the flag cleared by a major between requests
    @gc.need = :oldgen
    @now += Memory::OOB_MAJOR_GC_WAIT_SECONDS - 1 # counted from when this flag was first seen
    assert m.gc_due?(Memory::OOB_MAJOR_GC_WAIT_REQUESTS - 1)
    assert m.gc_due?(Memory::OOB_MAJOR_GC_WAIT_REQUESTS)
    refute @gc.full_marks
  end

  def test_a_ruby_without_the_control_is_named
    refute Memory.major_gc_control?(Object.new), "no GC.config (Ruby < 3.4)"
    assert_match(/\Aoob_major_gc needs GC\.config\(rgengc_allow_full_mark:\) \(Ruby >= 3\.4 with its default GC\); Ruby #{Regexp.escape(RUBY_VERSION)} has none/,
                 Memory.major_gc_unsupported(Object.new))
    other = Object.new
    def other.config = { implementation: "mmtk" }
    refute Memory.major_gc_control?(other), "a GC.config without rgengc_allow_full_mark (another GC)"
    assert_match(/Ruby #{Regexp.escape(RUBY_VERSION)} with the mmtk GC has none/, Memory.major_gc_unsupported(other))
    assert Memory.major_gc_control?(@gc)
    assert_nil Memory.major_gc_unsupported(@gc)
  end

  # This Ruby's GC: with full marks off, allocation that needs a major (malloc'd memory past the
  # oldmalloc limit) gets need_major_by set and no major run; Memory then says a GC is due and
  # #collect runs the major. In a Ruby of its own: in the test process, what other tests left (their
  # threads, a GC one of them starts, limits grown by their heaps) could run or delay the major.
  PROBE = <<~RUBY
    require "json"
    require "blackbuck/memory"
    m = Blackbuck::Memory.new({ oob_gc: 0, oob_gc_auto: false, oob_major_gc: true, max_memory_per_child: 0 },
                              proc: "/nonexistent")
    m.start
    out = { "full_mark_off" => !GC.config[:rgengc_allow_full_mark], "majors" => GC.stat(:major_gc_count) }
    400.times do
      20.times { "x" * 100_000 } # 2 MB malloc'd, freed by minor GCs
      break if GC.latest_gc_info(:need_major_by)
    end
    out["flagged"] = GC.latest_gc_info(:need_major_by)&.to_s
    out["majors_then"] = GC.stat(:major_gc_count)
    out["due"] = m.gc_due?(1)
    m.collect
    out.merge!("majors_after" => GC.stat(:major_gc_count), "flag_after" => GC.latest_gc_info(:need_major_by),
               "due_after" => m.gc_due?(2))
    print JSON.generate(out)
  RUBY

  def test_this_rubys_gc_flags_a_major_and_collect_runs_it
    skip "GC.config(rgengc_allow_full_mark:) is Ruby >= 3.4's; this is #{RUBY_VERSION}" unless Memory.major_gc_control?
    lib = File.expand_path("../../lib", __dir__)
    out, status = Open3.capture2(RbConfig.ruby, "-I#{lib}", "-e", PROBE)
    assert status.success?, out
    r = JSON.parse(out)
    assert r["full_mark_off"]
    refute_nil r["flagged"], "Ruby flagged a major"
    assert_equal r["majors"], r["majors_then"], "and ran none itself"
    assert r["due"]
    assert_equal r["majors"] + 1, r["majors_after"]
    assert_nil r["flag_after"]
    refute r["due_after"]
  end
end
