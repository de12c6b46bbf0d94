# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"

# The mold's loop without a process: its socket is one end of a real SEQPACKET pair the test speaks
# as the master would (Messages), and the forker is a stand-in that records the workers it was asked
# for (Forker#worker_from_mold forks; test/slow/refork_test.rb runs the real thing).
class MoldTest < Minitest::Test
  Messages = Blackbuck::Messages

  class Log
    attr_reader :lines

    def initialize = @lines = []
    %i[info warn error].each { |level| define_method(level) { |msg| @lines << msg } }
    def exception(msg, err) = @lines << "#{msg}: #{err.class}: #{err.message}"
  end

  # Forker#worker_from_mold's stand-in: answers Spawned as the middle process would, or raises.
  class Forker
    attr_reader :asked

    def initialize(fail_with: nil)
      @asked = []
      @fail_with = fail_with
    end

    def worker_from_mold(index, control, answers)
      raise @fail_with.tap { @fail_with = nil } if @fail_with # (once)

      @asked << [index, control.closed?]
      Messages.send_datagram(answers, Messages::Spawned.new(index, 7000 + index))
    end
  end

  def setup
    @log = Log.new
    @master, @mine = Socket.pair(:UNIX, :SEQPACKET)
    @hooks = []
  end

  def teardown = [@master, @mine].each { |s| s.close unless s.closed? }

  def mold(forker, before_fork: ->(_server, index) { @hooks << index })
    config = Blackbuck::Config::DEFAULTS.merge(before_fork: before_fork)
    Blackbuck::Mold.new(forker: forker, line: nil, config: config, logger: @log, server: :the_server, index: 3)
                   .tap { |m| m.instance_variable_set(:@socket, @mine) }
  end

  # Sends one spawn request as Refork#ask does; returns the master's end of the control pipe.
  def ask(index)
    r, w = IO.pipe
    Messages.send_datagram(@master, Messages::SpawnRequest.new(index, r))
    r.close
    w
  end

  def serve(mold)
    @master.shutdown(Socket::SHUT_WR) # the master is done with this mold: serve returns once it has read all
    mold.send(:serve)
  end

  def test_one_worker_per_request_each_answered_then_it_ends_when_the_master_closes_its_end
    forker = Forker.new
    controls = [ask(0), ask(2)]
    serve(mold(forker))
    assert_equal [[0, false], [2, false]], forker.asked, "the control pipe came along, open while forking"
    assert_equal [0, 2], @hooks, "before_fork, once per worker"
    answers = Array.new(2) { Messages.receive(@master) }
    assert_equal [[0, 7000], [2, 7002]], answers.map { |a| [a.index, a.pid] }
  ensure
    controls&.each(&:close)
  end

  def test_a_fork_that_fails_is_answered_so_and_the_mold_serves_on
    forker = Forker.new(fail_with: Errno::EAGAIN.new("fork"))
    control = ask(1)
    again = ask(1)
    serve(mold(forker))
    failed = Messages.receive(@master)
    assert_instance_of Messages::SpawnFailed, failed
    assert_equal 1, failed.index
    assert_match(/Errno::EAGAIN/, failed.why)
    assert_match(/forking worker 1 failed/, @log.lines.last)
    assert_equal [1, 7001], Messages.receive(@master).then { |a| [a.index, a.pid] }, "the next request is served"
  ensure
    [control, again].each { |w| w&.close }
  end

  def test_what_is_not_a_request_is_logged_and_ignored
    @master.send("nonsense", 0)
    serve(mold(Forker.new))
    assert_match(/mold \(pid \d+\): not a request, ignored: .*nonsense/, @log.lines.last)
  end

  def test_a_worker_that_is_not_fork_safe_says_why_on_the_line
    line, inbox = Socket.pair(:UNIX, :SEQPACKET)
    Blackbuck::Mold.refuse(line, "it started a thread", pid: 4242)
    said = Messages.receive(inbox)
    assert_equal [4242, "it started a thread"], [said.pid, said.why]
    Blackbuck::Mold.refuse(nil, "no line: nothing to say") # (reforking off)
  ensure
    [line, inbox].each { |s| s&.close }
  end
end
