# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"

# The request timeout without workers: a real scoreboard whose slots show a request running for
# as long as the test says, stand-in children that record the signals, a clock the test moves.
class RequestTimeoutsTest < Minitest::Test
  Child = Blackbuck::Children::Child
  BUSY = Blackbuck::Native::Scoreboard::BUSY
  IDLE = Blackbuck::Native::Scoreboard::IDLE
  KILL_GRACE = Blackbuck::RequestTimeouts::KILL_GRACE

  class FakeLogger
    attr_reader :lines

    def initialize = @lines = []
    def error(msg) = @lines << msg
  end

  # What the check asks of Children: each, [] and signal.
  class FakeChildren
    include Enumerable
    attr_reader :signals

    def initialize(children) = (@children, @signals = children, [])
    def each(&) = @children.each(&)
    def [](pid) = @children.find { |c| c.pid == pid }
    def signal(sig, pid) = @signals << [sig, pid]
    def remove(pid) = @children.reject! { |c| c.pid == pid }
    def add(child) = @children << child
  end

  def setup
    @board = Blackbuck::Native::Scoreboard.new(2)
    @board.reset(0, 100)
    @board.reset(1, 101)
    @log = FakeLogger.new
    @now = 50.0
    @kids = FakeChildren.new([Child.new(0, 100, nil, 0.0, true), Child.new(1, 101, nil, 0.0, true)])
  end

  def timeouts(seconds = 2) = Blackbuck::RequestTimeouts.new(seconds, @board, @log, clock: -> { @now })

  def running(index, seconds) = @board.running(index, BUSY, seconds, "GET", "/slow")
  def idle(index) = @board.running(index, IDLE, nil, "", "")

  def test_a_request_past_the_timeout_is_told_once_then_killed_after_the_grace
    check = timeouts
    running(0, 1.0)
    check.check(@kids)
    assert_empty @kids.signals
    running(0, 2.5)
    check.check(@kids)
    assert_equal [[:USR2, 100]], @kids.signals
    assert_match(%r{\Aworker 0 \(pid 100\) timeout: GET /slow running for 2\.5\d*s\z}, @log.lines.last)
    @now += KILL_GRACE
    check.check(@kids)
    assert_equal [[:USR2, 100]], @kids.signals, "USR2 once; SIGKILL only after KILL_GRACE"
    @now += 0.1
    check.check(@kids)
    assert_equal [[:USR2, 100], [:KILL, 100]], @kids.signals
    assert_equal "worker 0 (pid 100) did not stop after the timeout; killing it", @log.lines.last
  end

  def test_a_worker_that_came_back_is_told_again_on_its_next_slow_request
    check = timeouts
    running(1, 3.0)
    check.check(@kids)
    idle(1)
    check.check(@kids)
    running(1, 3.0)
    @now += KILL_GRACE + 1
    check.check(@kids)
    assert_equal [[:USR2, 101], [:USR2, 101]], @kids.signals
  end

  # Its notice goes with it: a new worker that happens to get its pid is told, not killed.
  def test_a_reaped_worker_is_forgotten
    check = timeouts
    running(0, 3.0)
    check.check(@kids)
    @kids.remove(100)
    check.check(@kids)
    @kids.add(Child.new(0, 100, nil, 0.0, true))
    @now += KILL_GRACE + 1
    check.check(@kids)
    assert_equal [[:USR2, 100], [:USR2, 100]], @kids.signals
  end

  def test_zero_is_no_timeout
    check = timeouts(0)
    running(0, 3600.0)
    check.check(@kids)
    assert_empty @kids.signals
    assert_empty @log.lines
  end
end
