# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"
require "tmpdir"
require "fileutils"
require "timeout"

# Native::Handoff and Conn.receive without a server: the watcher thread moves only an IDLE
# connection with a request waiting and nothing buffered, and only while the app runs; the
# receiver rebuilds it with its listener's template, address and request count; request_done
# without request_start (an exception between the two) neither blocks nor unlocks twice.
class HandoffUnitTest < Minitest::Test
  Native = Blackbuck::Native
  AFTER = 0.002 # handoff_after, seconds
  TURN = 0.05   # handoff_after where the test counts the watcher's turns, seconds
  WAIT = 15     # seconds a test waits for a state (the watcher thread runs when the machine lets it)

  def setup
    Native.configure(Blackbuck::Config.new.values) # C has no settings until then (Server.run does it first)
    @dir = Dir.mktmpdir("bb-handoff")
    @server = UNIXServer.new("#{@dir}/s")
    @sender, @receiver = Socket.pair(:UNIX, :SEQPACKET)
    @poller = Native::Poller.new(64)
    @scoreboard = Native::Scoreboard.new(1)
    @handoff = Native::Handoff.new(@poller, @sender.fileno, AFTER, @scoreboard)
    assert @handoff.start
    @clients = []
    @conns = []
  end

  def teardown
    @handoff.stop
    (@conns + @clients).each(&:close)
    [@server, @sender, @receiver].each(&:close)
    FileUtils.rm_rf(@dir)
  end

  # An accepted connection that has served one request, registered for input like the worker does.
  def idle_conn(listener_index: 0)
    @clients << (client = UNIXSocket.new("#{@dir}/s"))
    conn = Native::Conn.accept(@server.fileno, { "SERVER_NAME" => "x" }, false, false, listener_index)
    conn.enter(Native::Conn::IDLE, 30)
    @poller.watch(conn, Native::Poller::IN)
    @conns << conn
    [conn, client]
  end

  # The connection whose request the app runs (request_start shows its method and path): it has
  # read and parsed `GET path`. One per test.
  def app_conn(path = "/")
    @app_conn ||= begin
      @clients << (client = UNIXSocket.new("#{@dir}/s"))
      conn = Native::Conn.accept(@server.fileno, { "SERVER_NAME" => "x" }, false, false, 0)
      @conns << conn
      client.write("GET #{path} HTTP/1.1\r\nHost: x\r\n\r\n")
      Timeout.timeout(15) { sleep 0.001 until conn.fill(0.0) }
      assert_kind_of Hash, conn.parse
      conn.enter(Native::Conn::BUSY, 30)
      conn
    end
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Polls until the block is true (its value is returned), or raises after WAIT seconds.
  def wait_until(what)
    deadline = now + WAIT
    until (v = yield)
      raise "#{what}: not within #{WAIT}s" if now > deadline

      sleep 0.001
    end
    v
  end

  # conn.fill once the client's bytes have arrived (it answers nil until then): the bytes read.
  def fill_arrived(conn, woke_at = 0.0) = wait_until("bytes to read") { conn.fill(woke_at) }

  # While the app runs: the watcher has moved n connections (it looks every handoff_after).
  def wait_moved(n) = wait_until("#{n} moved") { @handoff.moved_out >= n }

  # Notes in seen how many moved (n, or n's size) against the watcher turns possible since `since`
  # (counted after n was read); returns n.
  def count_moves(seen, n, since)
    seen << [n.is_a?(Array) ? n.size : n, ((now - since) / TURN).floor]
    n
  end

  # End of input or a reset (the socket was closed with the client's request unread).
  def closed?(client)
    Timeout.timeout(15) { client.read }
    true
  rescue Errno::ECONNRESET
    true
  rescue Timeout::Error
    false
  end

  def test_a_waiting_idle_connection_moves_only_while_the_app_runs
    conn, client = idle_conn(listener_index: 1)
    client.write("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    sleep AFTER * 10
    assert_nil Native::Conn.receive(@receiver.fileno, []), "nothing moves while no app runs"
    @handoff.request_start(0, app_conn("/slow"), 0.0)
    slot = @scoreboard.read(0)
    assert_equal [Native::Scoreboard::BUSY, "GET", "/slow"], [slot.state, slot.request_method, slot.path],
                 "the scoreboard's request_start too"
    wait_moved(1) # the app runs long
    seen_moved = now # the mover saw the request waiting before this
    moved = @handoff.request_done(0, 0)
    slot = @scoreboard.read(0)
    assert_equal [Native::Scoreboard::IDLE, 1], [slot.state, slot.requests], "the scoreboard's request_done too"
    assert_equal [conn.fd], moved
    assert conn.moved?
    assert_equal 1, @handoff.moved_out
    templates = [[{ "test.listener" => "zero" }.freeze, true], [{ "test.listener" => "one" }.freeze, false]]
    sleep AFTER * 5 # it waits on the hand-off socket a while (measured below: the bound is the time that passed)
    received = now
    got = Native::Conn.receive(@receiver.fileno, templates)
    refute_nil got
    refute got.tcp?, "the listener's kind travels by its index"
    conn.close # the mover lets go; the socket lives on in the receiver
    assert_operator got.fill(Process.clock_gettime(Process::CLOCK_MONOTONIC)), :>, 0, "the request bytes moved with it"
    env = got.parse
    assert_equal "one", env["test.listener"], "its listener's env template"
    assert_equal "/next", env["PATH_INFO"]
    assert_equal "127.0.0.1", env["REMOTE_ADDR"]
    assert_operator got.start_app({}), :>=, received - seen_moved, "queue time counts from when the mover saw it waiting"
    got.write_response(200, { "content-length" => "2" }, ["ok"], false)
    assert_match(/\AHTTP\/1.1 200 .*\r\n\r\nok\z/m, client.readpartial(1024))
    got.close
  end

  # One connection per watcher turn (every handoff_after while the app runs), not all at once: the
  # watcher's first turn comes handoff_after into the app and each next one handoff_after later, so
  # at no moment have more moved than whole turns could have passed since the app began. (A busy
  # machine only makes turns later; the bound holds however long the test waits to look.)
  def test_waiting_connections_move_one_per_turn
    @handoff.stop
    @handoff = Native::Handoff.new(@poller, @sender.fileno, TURN, @scoreboard)
    assert @handoff.start
    pairs = Array.new(3) { idle_conn }
    pairs.each { |_, client| client.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }
    seen = [] # [connections moved in this app call, whole turns possible by then]
    began = now
    @handoff.request_start(0, app_conn, 0.0)
    wait_until("the first move") { count_moves(seen, @handoff.moved_out, began) >= 1 }
    first = count_moves(seen, (@handoff.request_done(0, 0) || []), began)
    began = now
    @handoff.request_start(0, app_conn, 0.0) # the next app call: the others move on, one per turn
    wait_until("the others") { count_moves(seen, @handoff.moved_out - first.size, began) == pairs.size - first.size }
    rest = @handoff.request_done(0, 0) || []
    assert_empty seen.reject { |n, turns| n <= turns }, "moved faster than one per turn: [moved, turns] #{seen.uniq}"
    assert_equal pairs.map { |c, _| c.fd }.sort, (first + rest).sort, "the others went one by one"
    3.times { Native::Conn.receive(@receiver.fileno, [[{}, false]])&.close }
  end

  def test_a_connection_mid_request_with_bytes_read_or_closed_stays
    busy, busy_client = idle_conn
    busy.enter(Native::Conn::BUSY, 30) # the request the app runs
    buffered, buffered_client = idle_conn
    gone, gone_client = idle_conn
    gone_client.close # readable too (end of input), but no request: the worker drops it itself
    [busy_client, buffered_client].each { |c| c.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }
    buffered_client.write("GET /two HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_operator fill_arrived(buffered), :>, 0 # read into user space: a pipelined request
    buffered_client.write("X") # and still readable
    @handoff.request_start(0, app_conn, 0.0)
    sleep AFTER * 20
    assert_nil @handoff.request_done(0, 0)
    refute busy.moved?
    refute buffered.moved?
    refute gone.moved?
    assert_nil Native::Conn.receive(@receiver.fileno, [])
  end

  # Conn#pass_request (--threads: a request queued for busy app threads, taken back): the request
  # already parsed travels in the message with its socket; the receiver parses it again, then reads
  # what the client sent after it. A request with a body, or with bytes behind it, or whose response
  # has started, stays.
  def test_a_parsed_request_moves_with_its_bytes
    conn, client = idle_conn(listener_index: 1)
    client.write("GET /queued?x=1 HTTP/1.1\r\nHost: h\r\n\r\n")
    assert_operator fill_arrived(conn, 12.5), :>, 0
    env = conn.parse
    assert_equal "/queued", env["PATH_INFO"]
    assert_equal true, conn.pass_request(@sender.fileno)
    assert conn.moved?
    conn.close
    client.write("GET /after HTTP/1.1\r\nHost: h\r\n\r\n")
    got = Native::Conn.receive(@receiver.fileno, [[{}, false], [{ "bb.listener" => "second" }, false]])
    @conns << got
    assert_operator got.buffered, :>, 0, "the carried request is in its buffer"
    env = got.parse
    assert_equal ["/queued", "x=1", "second"], env.values_at("PATH_INFO", "QUERY_STRING", "bb.listener")
    assert_nil got.parse, "nothing else was carried"
    assert_operator fill_arrived(got), :>, 0
    assert_equal "/after", got.parse["PATH_INFO"], "then the socket's own bytes"
  end

  def test_a_parsed_request_with_a_body_bytes_behind_it_or_an_answer_stays
    body, body_client = idle_conn
    piped, piped_client = idle_conn
    answered, answered_client = idle_conn
    body_client.write("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi")
    piped_client.write("GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\n\r\n")
    answered_client.write("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    [body, piped, answered].each do |c|
      fill_arrived(c)
      assert_kind_of Hash, c.parse
    end
    answered.write_response(200, { "content-length" => "2" }, ["ok"], false)
    [body, piped, answered].each { |c| assert_equal false, c.pass_request(@sender.fileno) }
    refute [body, piped, answered].any?(&:moved?)
    assert_nil Native::Conn.receive(@receiver.fileno, [[{}, false]])
  end

  # The watcher thread shares the worker's fd table and keeps no copy of a client socket: one the
  # worker closes while a watcher runs is closed.
  def test_the_watcher_keeps_no_copy_of_a_client_socket
    conn, client = idle_conn
    other = Native::Handoff.new(@poller, @sender.fileno, AFTER, @scoreboard)
    other.start
    @poller.delete(conn.fd)
    conn.close
    assert closed?(client), "the client sees the close"
  ensure
    other&.stop
  end

  def test_request_done_without_request_start_returns_at_once
    Timeout.timeout(15) do # (a guard against a lock held for ever)
      assert_nil @handoff.request_done(0, 0)
      @handoff.request_start(0, app_conn, 0.0)
      @handoff.request_start(0, app_conn, 0.0) # twice: the lock is released once
      assert_nil @handoff.request_done(0, 0)
      assert_nil @handoff.request_done(0, 0)
    end
  end

  def test_a_message_for_an_unknown_listener_is_refused_and_its_socket_closed
    conn, client = idle_conn(listener_index: 7)
    client.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    @handoff.request_start(0, app_conn, 0.0)
    wait_moved(1)
    assert_equal [conn.fd], @handoff.request_done(0, 0)
    conn.close
    assert_equal false, Native::Conn.receive(@receiver.fileno, [[{}, false]])
    assert closed?(client), "the client sees the close: no one holds the socket"
  end
end
