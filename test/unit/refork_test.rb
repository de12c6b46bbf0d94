# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"

# Refork's decisions without forking: real Children (with real control pipes and a real scoreboard
# whose request counts the test writes as workers would), the announcement line spoken to as a
# worker and a mold would (Messages). (The processes themselves: test/slow/refork_test.rb.)
class ReforkDecisionsTest < Minitest::Test
  Children = Blackbuck::Children
  Messages = Blackbuck::Messages

  class Log
    attr_reader :lines

    def initialize = @lines = []
    def info(msg) = @lines << msg
    def warn(msg) = @lines << msg
    def error(msg) = @lines << msg
  end

  def setup
    @board = Blackbuck::Native::Scoreboard.new(4)
    @log = Log.new
    @kids = Children.new(@board, @log)
    @pipes = {} # pid => read end of its control pipe
    @refork = Blackbuck::Refork.new([10, 20], children: @kids, scoreboard: @board, logger: @log,
                                              subreaper: -> { true })
  end

  def teardown
    @pipes.each_value { |io| io.close unless io.closed? }
    @refork.close_in_child
  end

  # A started worker of slot index that has served `served` requests.
  def worker(index, pid, served: 0, generation: 0)
    r, w = IO.pipe
    @pipes[pid] = r
    @kids.add(Children::Child.new(index, pid, w, 0.0, true, generation, :master))
    @board.reset(index, pid)
    served.times { @board.request_done(index, Blackbuck::Native::Scoreboard::IDLE) }
  end

  # The control message the worker pid was told since the last look, or nil.
  def told(pid) = Messages.receive_control(@pipes[pid]).then { |m| m.is_a?(Messages::Control) ? m : nil }

  # from: the worker that forked it, [pid, index] (nil: the mold that booted the app)
  def announce_mold(pid, from = nil)
    @mold_end, theirs = Socket.pair(:UNIX, :SEQPACKET)
    Messages.send_datagram(@refork.line, Messages::MoldReady.new(pid, theirs, *from))
    theirs.close
  end

  # As Children#reap and the master do once the worker pid has exited.
  def reaped(pid) = @kids.delete(pid)&.then { |child| @refork.worker_exited(child) }

  # As Children#reap does once a child that is not one of its workers has exited (a mold's entry
  # goes with it).
  def reap_other(refork, pid, status, why = nil)
    refork.reaped(pid, status, @kids.instance_variable_get(:@molds).delete(pid), why)
  end

  def test_off_without_counts_or_without_a_subreaper
    refute Blackbuck::Refork.new([], children: @kids, scoreboard: @board, logger: @log).on?
    off = Blackbuck::Refork.new([5], children: @kids, scoreboard: @board, logger: @log, subreaper: -> { false })
    refute off.on?
    assert_match(/cannot make the master a child subreaper .* reforking is off/, @log.lines.last)
  end

  def test_the_first_worker_past_its_count_is_told_to_become_the_mold_once
    worker(0, 100, served: 3)
    worker(1, 101, served: 12)
    @refork.turn(2)
    assert_equal Messages::PROMOTE, told(101)
    assert_nil told(100)
    @refork.turn(2)
    assert_nil told(101), "one promotion at a time"
    assert_match(/worker 1 \(pid 101\) served 12 requests \(refork_after 10\); it forks the mold of generation 1/,
                 @log.lines.last)
  end

  # The worker exits as soon as its mold has announced itself: the master may reap it first.
  def test_a_mold_whose_worker_was_reaped_first_is_adopted_all_the_same
    worker(0, 100, served: 12)
    worker(1, 101)
    @refork.turn(2)
    reaped(100)
    announce_mold(500, [100, 0])
    @refork.turn(2)
    assert_equal [1, 500], [@refork.generation, @refork.mold.pid]
    assert_match(/refork: mold of generation 1 is pid 500 \(forked by worker 0, pid 100, which exits\)/, @log.lines.last)
  ensure
    @mold_end&.close
  end

  def test_nothing_happens_while_a_slot_has_no_serving_worker
    worker(0, 100, served: 50)
    @refork.turn(2)
    assert_nil told(100)
  end

  def test_the_mold_takes_the_slot_and_the_old_generation_is_replaced_one_at_a_time
    worker(0, 100, served: 12)
    worker(1, 101)
    worker(2, 102)
    @refork.turn(3)
    announce_mold(500, [100, 0])
    @refork.turn(3)
    assert_equal 1, @refork.generation
    assert_equal 500, @refork.mold.pid
    assert_match(/refork: mold of generation 1 is pid 500 \(forked by worker 0, pid 100, which exits\)/, @log.lines.last)
    reaped(100) # the worker that forked it exits: its slot is free
    @refork.turn(3)
    assert_nil told(101), "not until the free slot has a serving worker again"
    worker(0, 200, generation: 1)
    @refork.turn(3)
    retired = [101, 102].select { |pid| told(pid) == Messages::RETIRE }
    assert_equal 1, retired.size
    @refork.turn(3)
    assert_equal [], [101, 102].select { |pid| told(pid) }, "one at a time"
    reaped(retired.first)
    worker(@kids.map(&:index).then { |taken| ([0, 1, 2] - taken).first }, 201, generation: 1)
    @refork.turn(3)
    assert_equal [Messages::RETIRE], ([101, 102] - retired).map { |pid| told(pid) }
  ensure
    @mold_end&.close
  end

  def test_a_worker_that_is_not_fork_safe_turns_reforking_off
    worker(0, 100, served: 12)
    @refork.turn(1)
    assert_equal Messages::PROMOTE, told(100)
    Messages.send_datagram(@refork.line, Messages::Unsafe.new(100, "it started a thread"))
    @refork.turn(1)
    assert_equal :serving, @kids[100].state, "it serves on"
    assert @refork.on?, "a mold that booted the app still forks the workers"
    assert_match(/worker 0 \(pid 100\) is not fork-safe \(it started a thread\); reforking is off/, @log.lines.last)
    @refork.turn(1)
    assert_nil told(100)
  end

  def test_without_a_mold_the_master_forks
    refute @refork.ask(0)
  end

  def test_a_mold_that_closed_its_socket_is_forgotten_and_the_master_forks
    worker(0, 100, served: 12)
    @refork.turn(1)
    announce_mold(999_999_999) # no such process: the kill finds none
    @refork.turn(1)
    @mold_end.close
    refute @refork.ask(0)
    assert_nil @refork.mold
    assert_match(/could not fork worker 0 \((the mold closed its socket|Broken pipe.*)\); forking it from the master/, @log.lines.last)
  end

  # The master asks and goes on; the answer, read when the mold's socket is readable, adds the worker.
  def test_the_mold_is_asked_and_its_answer_read_later
    mold = adopt_mold_of_generation_one
    assert @refork.ask(1)
    assert @refork.asked?(1)
    assert_includes @refork.readers, mold.socket, "the master's loop wakes when the answer comes"
    asked = Messages.receive(@mold_end)
    assert_equal 1, asked.index
    asked.control.close
    @refork.listen
    assert_nil @kids[4242], "no answer yet: nothing waited for"
    Messages.send_datagram(@mold_end, Messages::Spawned.new(1, 4242))
    @refork.listen
    assert_equal [1, 1, :mold], @kids[4242].to_h.values_at(:index, :generation, :origin)
    refute @refork.asked?(1)
    refute_includes @refork.readers, mold.socket
  ensure
    @mold_end&.close
  end

  # A worker that exits before the master read its answer is the master's worker all the same.
  def test_a_worker_reaped_before_its_answer_was_read_is_a_worker
    adopt_mold_of_generation_one
    @refork.ask(1)
    Messages.send_datagram(@mold_end, Messages::Spawned.new(1, 4243))
    child = reap_other(@refork, 4243, exited_with(1))
    assert_equal [1, 4243], [child.index, child.pid]
    @refork.listen
    assert_nil @kids[4243], "it is gone: not added again"
  ensure
    @mold_end&.close
  end

  # What the master cannot read on the announcement line is logged and ignored: nothing changes.
  def test_a_malformed_announcement_is_ignored
    worker(0, 100, served: 12)
    @refork.turn(1)
    @refork.line.send("mold 500", 0) # no socket with it
    @refork.line.send("mold x 100 0", 0)
    @refork.turn(1)
    assert_nil @refork.mold
    assert_equal 0, @refork.generation
    assert_match(/refork: not an announcement, ignored: .*"mold 500"/, @log.lines[-2])
    assert_match(/refork: not an announcement, ignored: .*"mold x 100 0"/, @log.lines.last)
    worker(0, 100, served: 12)
    @refork.turn(1)
    assert_equal Messages::PROMOTE, told(100), "reforking goes on"
  end

  # A mold whose answer cannot be read is broken: it is killed, as one that does not answer would be
  # (without the wait).
  def test_a_mold_whose_answer_cannot_be_read_is_killed
    mold = adopt_mold_of_generation_one(pid: 999_999_999)
    @refork.ask(1)
    @mold_end.send("spawned 1 not-a-pid", 0)
    @refork.listen
    assert_nil @refork.mold
    assert mold.socket.closed?
    refute @refork.asked?(1)
    assert_match(/could not fork worker 1 \(not an answer: .*"spawned 1 not-a-pid".*\); forking it from the master/, @log.lines.last)
  ensure
    @mold_end&.close
  end

  # A mold that does not answer in FORK_SECONDS (stopped, hung) is given up on, never waited for.
  def test_a_mold_that_does_not_answer_in_time_is_killed
    mold = adopt_mold_of_generation_one(pid: 999_999_999)
    @refork.ask(1)
    later = Process.clock_gettime(Process::CLOCK_MONOTONIC) + Blackbuck::Refork::FORK_SECONDS
    @refork.define_singleton_method(:now) { later }
    @refork.listen
    assert_nil @refork.mold
    assert mold.socket.closed?
    refute @refork.asked?(1)
    assert_match(/the mold \(pid 999999999\) could not fork worker 1 \(no answer in 5s\); forking it from the master/, @log.lines.last)
  ensure
    @mold_end&.close
  end

  # The master holds no app: a mold that dies is replaced by one a serving worker forks, in the same
  # generation, not by one that boots whatever code is on disk.
  def test_a_mold_that_dies_is_replaced_by_one_a_worker_forks
    @refork.booting(300)
    announce_mold(300)
    @refork.turn(2)
    @mold_end.close
    worker(0, 100)
    worker(1, 101)
    reap_other(@refork, 300, exited_with(1))
    assert_match(/workers fork from a new mold a worker forks \(the code they run, not what is on disk\)/, @log.lines.last)
    @refork.turn(2, quiet: true)
    assert_equal Messages::PROMOTE, told(100)
    refute @refork.boot_due?, "a worker forks it: no boot"
    announce_mold(500, [100, 0])
    @refork.turn(2)
    assert_equal [0, 500], [@refork.generation, @refork.mold.pid]
    assert_match(/mold of generation 0 is pid 500 \(forked by worker 0, pid 100, which exits\); it replaces the mold that is gone/,
                 @log.lines.last)
  ensure
    @mold_end&.close
  end

  # The worker that forks the replacement exits once its mold has announced itself: the master may
  # reap it before it reads the announcement. That mold still replaces the one that died (the
  # generation stays) and no worker "exited without forking a mold" (CI caught generation 2 here).
  def test_a_replacing_worker_reaped_before_its_announcement_was_read_keeps_the_generation
    @refork.booting(300)
    announce_mold(300)
    @refork.turn(2)
    @mold_end.close
    worker(0, 100)
    worker(1, 101)
    reap_other(@refork, 300, exited_with(1))
    @refork.turn(2, quiet: true)
    assert_equal Messages::PROMOTE, told(100)
    announce_mold(500, [100, 0])
    reaped(100) # before any turn read the line
    @refork.turn(2)
    assert_equal [0, 500], [@refork.generation, @refork.mold&.pid]
    assert_empty @log.lines.grep(/exited without forking a mold/)
    assert_match(/mold of generation 0 is pid 500 .*; it replaces the mold that is gone/, @log.lines.last)
  ensure
    @mold_end&.close
  end

  # A worker told to fork it that exits without (it was already stopping) is followed by another;
  # after REPLACE_ATTEMPTS, or with no worker serving, a mold boots the app.
  def test_without_a_worker_to_fork_it_a_mold_boots_the_app
    @refork.booting(300)
    announce_mold(300)
    @refork.turn(1)
    @mold_end.close
    reap_other(@refork, 300, exited_with(1))
    pid = 100
    Blackbuck::ReforkPolicy::REPLACE_ATTEMPTS.times do
      worker(0, pid)
      @refork.turn(1)
      assert_equal Messages::PROMOTE, told(pid)
      reaped(pid)
      @refork.turn(1)
      pid += 1
    end
    assert_match(/exited without forking a mold; a new mold boots the app/, @log.lines.last)
    assert @refork.boot_due?
  end

  def test_a_reaped_mold_is_forgotten
    worker(0, 100, served: 12)
    @refork.turn(1)
    announce_mold(100)
    @refork.turn(1)
    status = Process::Status.wait(Process.spawn("true"))
    reap_other(@refork, 100, status)
    assert_nil @refork.mold
    assert_match(/mold \(pid 100, generation 1\) exited with status 0; workers fork from the master/, @log.lines.last)
  ensure
    @mold_end&.close
  end

  # The blackbuck command's master holds no app: a mold boots it and forks generation 0.
  def test_the_mold_that_boots_the_app_forks_generation_zero
    assert @refork.boot_due?, "no mold, nothing booting"
    @refork.booting(300)
    refute @refork.boot_due?, "one boot at a time"
    announce_mold(300)
    @refork.turn(2)
    assert_equal 0, @refork.generation, "the booted mold's workers are the first generation"
    assert_equal({ "pid" => 300, "generation" => 0, "booted_app" => true }, @refork.status["mold"])
    refute @refork.boot_due?, "a mold is there"
    assert_match(/mold of generation 0 is pid 300 \(it booted the app\)/, @log.lines.last)
  ensure
    @mold_end&.close
  end

  def test_a_first_boot_that_fails_ends_the_server_and_a_later_one_is_tried_again
    @refork.booting(300)
    reap_other(@refork, 300, exited_with(1), "cannot load config.ru: RuntimeError: boom")
    assert_equal "cannot load config.ru: RuntimeError: boom", @refork.take_boot_failure
    assert_nil @refork.take_boot_failure, "said once"

    booted = Blackbuck::Refork.new([10], children: @kids, scoreboard: @board, logger: @log, subreaper: -> { true })
    booted.booting(400)
    Messages.send_datagram(booted.line, Messages::MoldReady.new(400, theirs = Socket.pair(:UNIX, :SEQPACKET).first))
    theirs.close
    booted.turn(1)
    reap_other(booted, 400, exited_with(1)) # the mold died once the app had booted
    assert_match(/mold \(pid 400, generation 0\) exited with status 1; workers fork from a new mold a worker forks/, @log.lines.last)
    refute booted.boot_due?, "not before a turn has looked for a worker to fork it"
    booted.turn(1)
    assert booted.boot_due?, "no worker serves to fork it"
    booted.booting(401)
    reap_other(booted, 401, exited_with(1), "cannot load config.ru: LoadError")
    assert_nil booted.take_boot_failure, "the app booted before: the server serves on"
    assert_match(/booting the app exited with status 1: cannot load config.ru: LoadError; another boots in 1s/, @log.lines.last)
    refute booted.boot_due?, "not at once"
  ensure
    booted&.close_in_child
  end

  # The mold of generation 1, forked by worker 0 (pid 100); @mold_end is its end of the socket.
  def adopt_mold_of_generation_one(pid: 500)
    worker(0, 100, served: 12)
    @refork.turn(1)
    announce_mold(pid, [100, 0])
    @refork.turn(1)
    @refork.mold
  end

  def exited_with(code)
    pid = fork { exit!(code) }
    Process.wait2(pid).last
  end
end
