# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# The Forker's side in the master: what it hands the master for a worker it forked, the hooks, the
# crash pipe. The children here end in the block the master passes (its first code in the child),
# before any worker or mold runs; a real worker and mold: test/slow/refork_test.rb, test/slow/.
class ForkerTest < Minitest::Test
  Source = Struct.new(:app)

  def forker(**config)
    @hooks = []
    hook = ->(server, index) { @hooks << [server, index] }
    Blackbuck::Forker.new(server: :the_server, config: Blackbuck::Config::DEFAULTS.merge(before_fork: hook, **config),
                          source: Source.new(->(_env) { [200, {}, []] }), listeners: [], scoreboard: nil,
                          logger: nil, traps: %i[TERM], refork: nil)
  end

  def test_a_worker_forked_by_the_master_is_a_starting_child_with_its_control_pipe
    f = forker
    child = f.worker(2) { exit!(7) } # (the first code in the child)
    _, status = Process.wait2(child.pid)
    assert_equal 7, status.exitstatus, "the master's block ran first in the child"
    assert_equal [2, 0, :master, :starting, :worker], [child.index, child.generation, child.origin, child.state, child.role]
    refute child.control.closed?, "the write end stays the master's"
    assert_equal [[:the_server, 2]], @hooks, "before_fork, in the master"
  ensure
    child&.control&.close
  end

  def test_the_mold_that_boots_the_app_runs_the_masters_block_first
    pid = forker.booting_mold { exit!(5) }
    assert_equal 5, Process.wait2(pid).last.exitstatus
  end

  def test_a_crash_is_said_once_for_its_pid
    f = forker
    f.send(:tell_crash, "after_fork raised RuntimeError: boom")
    assert_nil f.crash_reason(Process.pid + 1)
    assert_equal "after_fork raised RuntimeError: boom", f.crash_reason(Process.pid)
    assert_nil f.crash_reason(Process.pid), "once"
  end

  def test_each_worker_recycles_after_a_count_drawn_from_the_range
    assert_equal 0, forker.send(:requests_limit), "max_requests_per_child 0: never"
    f = forker(max_requests_per_child: 20, min_requests_per_child: 10)
    limits = Array.new(200) { f.send(:requests_limit) }
    assert_equal [10, 20], limits.minmax
    assert_equal [15], Array.new(3) { forker(max_requests_per_child: 15).send(:requests_limit) }.uniq
  end

  def test_forker_process_runs_the_block_in_a_child
    r, w = IO.pipe
    pid = Blackbuck::Forker.process do
      w.write(Process.pid.to_s)
      exit!(0)
    end
    w.close
    assert_equal pid.to_s, r.read
    Process.wait(pid)
  ensure
    r&.close
  end
end
