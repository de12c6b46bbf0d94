# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"
require "tmpdir"
require "fileutils"
require "timeout"

# Moves that do not happen, without a server (issue 21, defect 4): a send that fails (here: no
# receiver is left) leaves the connection with its worker, on every path (the watcher thread,
# Conn#pass, Conn#pass_request), is counted in the worker's scoreboard slot and logged once per run
# of failures; a receiver short of descriptors takes nothing, counts a refusal and passes the
# wake-up on; the message stays queued for a receiver with room.
class HandoffFailuresUnitTest < Minitest::Test
  Native = Blackbuck::Native
  AFTER = 0.002 # handoff_after, seconds
  SEND = Blackbuck::RequestCounts::HANDOFF_FAILURES.index(:send)
  REFUSED = Blackbuck::RequestCounts::HANDOFF_FAILURES.index(:refused)

  # Native.logger's stand-in: the warnings C logs.
  class Warnings < Array
    def warn(msg) = push(msg)
  end

  def setup
    Native.configure(Blackbuck::Config.new.values) # C has no settings until then (Server.run does it first)
    @dir = Dir.mktmpdir("bb-handoff-failures")
    @server = UNIXServer.new("#{@dir}/s")
    @sender, @receiver = Socket.pair(:UNIX, :SEQPACKET)
    @poller = Native::Poller.new(64)
    @scoreboard = Native::Scoreboard.new(1)
    @scoreboard.reset(0, Process.pid) # this process is the slot's worker: C counts into it
    @warnings = Warnings.new
    Native.logger = @warnings
    @clients = []
    @conns = []
  end

  def teardown
    Native.logger = nil
    (@conns + @clients).each(&:close)
    [@server, @sender, @receiver].each { |s| s.close unless s.closed? }
    FileUtils.rm_rf(@dir)
  end

  def failed_moves = @scoreboard.histograms(0)[5]

  # An accepted connection with a request waiting, registered for input like the worker does.
  def waiting_conn
    @clients << (client = UNIXSocket.new("#{@dir}/s"))
    conn = Native::Conn.accept(@server.fileno, { "SERVER_NAME" => "x" }, false, false, 0)
    conn.enter(Native::Conn::IDLE, 30)
    @poller.watch(conn, Native::Poller::IN)
    @conns << conn
    client.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert IO.for_fd(conn.fd, autoclose: false).wait_readable(15), "the request has arrived"
    [conn, client]
  end

  # The request the app runs while the watcher looks.
  def app_conn
    @clients << (client = UNIXSocket.new("#{@dir}/s"))
    conn = Native::Conn.accept(@server.fileno, { "SERVER_NAME" => "x" }, false, false, 0)
    @conns << conn
    client.write("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    Timeout.timeout(15) { sleep 0.001 until conn.fill(0.0) }
    assert_kind_of Hash, conn.parse
    conn.enter(Native::Conn::BUSY, 30)
    conn
  end

  def test_failed_sends_leave_the_connection_with_its_worker_are_counted_and_logged_once
    @receiver.close # no receiver left: every send fails (EPIPE), never with EAGAIN
    conn, client = waiting_conn
    assert_equal false, conn.pass(@sender.fileno), "Conn#pass: not moved"
    refute conn.moved?
    assert_equal 1, failed_moves[SEND]
    assert_equal 1, @warnings.size
    assert_match(/hand-off: a connection could not move to another worker \(Broken pipe\); it stays with this one/,
                 @warnings.first)

    handoff = Native::Handoff.new(@poller, @sender.fileno, AFTER, @scoreboard)
    assert handoff.start
    handoff.request_start(0, app_conn, 0.0)
    # the watcher tries, every handoff_after: its failures are counted too
    Timeout.timeout(15) { sleep 0.001 until failed_moves[SEND] > 1 }
    assert_nil handoff.request_done(0, 0), "the watcher moved nothing"
    refute conn.moved?
    assert_equal 0, handoff.moved_out
    assert_equal 1, @warnings.size, "one line for the run of failures"

    # Still this worker's: it answers the request on it.
    assert_operator conn.fill(0.0), :>, 0
    assert_equal "/", conn.parse["PATH_INFO"]
    assert_equal false, conn.pass_request(@sender.fileno), "Conn#pass_request: a failed send is no full queue (nil)"
    refute conn.moved?
    conn.write_response(200, { "content-length" => "2" }, ["ok"], false)
    assert_match(/\AHTTP\/1.1 200 .*\r\n\r\nok\z/m, client.readpartial(1024))
    assert_equal 1, @warnings.size
  ensure
    handoff&.stop
  end

  # A receiver with fewer than its reserve of descriptors free refuses (Errno::EMFILE) without taking
  # the connection, counts it and sends a wake-up; with room, it takes that very connection.
  def test_a_receiver_short_of_descriptors_leaves_the_connection_queued
    conn, client = waiting_conn
    assert_equal true, conn.pass(@sender.fileno)
    conn.close
    soft, hard = Process.getrlimit(:NOFILE)
    lowest = IO.sysopen(File::NULL).tap { |fd| IO.for_fd(fd).close }
    begin
      Process.setrlimit(:NOFILE, lowest + 8, hard) # 8 free: under the reserve
      assert_raises(Errno::EMFILE) { Native::Conn.receive(@receiver.fileno, [[{}, false]], @sender.fileno) }
    ensure
      Process.setrlimit(:NOFILE, soft, hard)
    end
    assert_equal 1, failed_moves[REFUSED]
    got = Native::Conn.receive(@receiver.fileno, [[{}, false]])
    refute_nil got, "the connection stayed queued; the wake-up behind it is skipped"
    @conns << got
    assert_nil Native::Conn.receive(@receiver.fileno, [[{}, false]]), "nothing else: the wake-up is gone"
    assert_operator got.fill(0.0), :>, 0
    got.write_response(200, { "content-length" => "2" }, ["ok"], false)
    assert_match(/\AHTTP\/1.1 200 .*\r\n\r\nok\z/m, client.readpartial(1024))
    assert_equal 1, failed_moves[REFUSED]
  end
end
