# frozen_string_literal: true

require "minitest/autorun"
require "tmpdir"
require "fileutils"
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
