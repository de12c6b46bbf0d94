# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"
require "tmpdir"

# A Worker's loop with the master replaced by stand-ins: a control pipe the test writes, a real
# scoreboard, a UNIX listener in a tmpdir, the announcement line as a socket pair. The worker runs
# in a child of the test (its traps and exit are a process's own) and writes what #run returned on
# a pipe; the test speaks HTTP to it and tells it what the master would.
class WorkerTest < Minitest::Test
  Messages = Blackbuck::Messages

  def setup
    @dir = Dir.mktmpdir("bb-worker")
    @path = File.join(@dir, "w.sock")
    @listener = Blackbuck::Listeners.bind("unix:#{@path}", backlog: 16)
    @board = Blackbuck::Native::Scoreboard.new(2)
    @control_r, @control_w = IO.pipe
    @line, @inbox = Socket.pair(:UNIX, :SEQPACKET)
    @ran_r, @ran_w = IO.pipe
  end

  def teardown
    Process.kill(:KILL, @pid) if @pid && !@reaped
    Process.wait(@pid) if @pid && !@reaped
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  ensure
    [@control_r, @control_w, @line, @inbox, @ran_r, @ran_w].each { |io| io.close unless io.nil? || io.closed? }
    @listener&.close
    FileUtils.rm_rf(@dir)
  end

  APP = lambda do |env|
    Blackbuck.no_longer_fork_safe!("the test said so") if env["PATH_INFO"] == "/unsafe"
    [200, { "content-type" => "text/plain" }, ["pid #{Process.pid}"]]
  end

  # The worker of slot 1, in a child; its pid.
  def start_worker
    @pid = fork do
      [@control_w, @inbox, @ran_r].each(&:close)
      config = Blackbuck::Config.new.values
      Blackbuck::Native.configure(config) # (Server.run's, in the master)
      logger = Blackbuck::Logger.new(File.open(File::NULL, "w"))
      role = Blackbuck::Worker.new(index: 1, app: APP, config: config, listeners: [@listener], control: @control_r,
                                   scoreboard: @board, logger: logger, mold_line: @line).run
      @ran_w.write(role.to_s)
      exit!(0)
    rescue Exception => e # rubocop:disable Lint/RescueException -- never back into the test runner
      @ran_w.write("raised #{e.class}: #{e.message}")
      exit!(1)
    end
    @control_r.close
    @ran_w.close
    @pid
  end

  def get(path)
    UNIXSocket.open(@path) do |s|
      s.write("GET #{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      s.read
    end
  end

  # What #run returned, once the worker exited, and its exit status.
  def finish
    flunk "the worker did not finish in 30 s" unless @ran_r.wait_readable(30) # (a bound on a hang, not a wait)
    role = @ran_r.read
    _, status = Process.wait2(@pid)
    @reaped = true
    [role, status.exitstatus]
  end

  def test_it_takes_its_slot_serves_and_stops_when_the_master_says_so
    start_worker
    assert_match(/\AHTTP\/1.1 200 OK\r\n.*pid #{@pid}\z/m, get("/"))
    assert_equal @pid, @board.read(1).pid, "the slot is its own once it serves"
    assert_operator @board.read(1).requests, :>=, 1
    Messages.tell(@control_w, Messages::STOP)
    assert_equal ["worker", 0], finish
  end

  def test_told_to_fork_the_mold_it_stops_serving_and_says_so
    start_worker
    get("/")
    Messages.tell(@control_w, Messages::PROMOTE)
    assert_equal ["mold", 0], finish
    assert_equal Blackbuck::Native::Scoreboard::STOPPING, @board.read(1).state
  end

  def test_an_app_that_is_not_fork_safe_refuses_the_promotion_and_serves_on
    start_worker
    get("/unsafe")
    Messages.tell(@control_w, Messages::PROMOTE)
    said = Messages.receive(@inbox)
    assert_equal [@pid, "the test said so"], [said.pid, said.why]
    assert_match(/pid #{@pid}\z/, get("/"), "it serves on")
    Messages.tell(@control_w, Messages::STOP)
    assert_equal ["worker", 0], finish
  end

  def test_when_the_master_is_gone_it_finishes_and_exits
    start_worker
    get("/")
    @control_w.close
    assert_equal ["worker", 0], finish
  end
end
