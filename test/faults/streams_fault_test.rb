# frozen_string_literal: true

require_relative "fault_helper"

# Issue 35, step 3 (docs/ARCHITECTURE.md, "Long streams"): faults with 1,000 open streams on two
# workers with --streams and one app thread. Clients that vanish mid-stream (a FIN or a reset), bodies
# that raise midway, TERM and HUP: nothing leaks (each worker's descriptors, threads, live fibers,
# stream bodies), no plain request is lost, and a stream a stop ends gets its last chunk.
#
# The streams (test/apps/stream_faults.ru) send their first events and then wait at a gate, a FIFO
# the test opens for every worker at once, so "1,000 streams are open mid-stream" is a state the test
# holds for as long as it needs, and costs the server nothing meanwhile (no timer, no polling). The
# test reads them all from one thread (IO.select over raw sockets to 127.0.0.1).
class StreamsFaultTest < FaultTest
  STREAMS = 1_000
  PRE = 2  # events each stream sends before the gate
  POST = 3 # events a surviving stream sends after it (0.1 s apart)
  GAP = 0.1
  GRACEFUL = 2 # --graceful-timeout for TERM: how long a stopping worker lets its streams run
  HUP_GRACEFUL = 4 # ... for HUP: long enough for the new workers' streams to run before the old ones end
  # Every stream may land on one worker (a worker takes all a wake-up's connections): the default of
  # 1,024 connections a worker would leave room for 24 more there.
  MAX_CONNECTIONS = 2_048
  FDS_NEEDED = STREAMS + 1_024 # this process's descriptors: the streams' sockets and the rest (raised if it may)
  WAIT = 60 # seconds any state is waited for at most: a bound for a stuck server, not a measure of speed
  STOP_MARGIN = 10 # seconds after graceful_timeout by which every stream of a stopping worker has ended
  LAST_CHUNK = "0\r\n\r\n"
  FAILED = /body failed after the head was sent/ # a body that raised midway (logged by the worker)
  READ_CHUNK = 65_536

  STALLED_RCVBUF = 16_384 # bytes: the receive buffer of a client that stops reading

  # One stream's client: a raw socket and what it has read. kind: what the test does with it (a
  # :stalled one stops reading once it has the first PRE events). ended: :eof, :reset or :vanished
  # (the test closed it), at ended_at (CLOCK_MONOTONIC).
  class Client
    attr_reader :io, :kind, :data, :ended, :ended_at

    def initialize(io, kind)
      @io = io
      @kind = kind
      @data = +""
      @ended = nil
      @parsed = nil
    end

    def read_some
      chunk = @io.read_nonblock(READ_CHUNK, exception: false)
      return if chunk == :wait_readable
      return finish(:eof) if chunk.nil?

      @data << chunk
      @parsed = nil
    rescue Errno::ECONNRESET
      finish(:reset)
    end

    # The client goes: a FIN, or a reset (SO_LINGER 0) when rst.
    def vanish(rst)
      @io.setsockopt(Socket::Option.linger(true, 0)) if rst
      @io.close
      finish(:vanished)
    end

    def close = (@io.close unless @io.closed?)

    # Read no more (IO.select leaves it out): a stalled client that has its first events.
    def idle? = @ended || (@kind == :stalled && events.size >= PRE)

    def pid = head&.[](/^x-worker-pid: *(\d+)/i, 1)&.to_i
    def head = @data[/\A.*?\r\n\r\n/m]

    # The event numbers received, in order.
    def events = parse[0]

    # The last chunk came (a stream that ended cleanly).
    def last_chunk? = parse[1]

    private

    def finish(how)
      @ended ||= how
      @ended_at ||= Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # [event numbers, whether the last chunk came] from the chunked body read so far.
    def parse
      @parsed ||= begin
        body = +""
        done = false
        rest = @data.split("\r\n\r\n", 2)[1] || ""
        while (eol = rest.index("\r\n"))
          size = rest[0, eol].to_i(16)
          break if rest.bytesize < eol + 2 + size + 2

          (done = true) && break if size.zero?
          body << rest.byteslice(eol + 2, size)
          rest = rest.byteslice((eol + 2 + size + 2)..)
        end
        [body.scan(/data: (\d+)\n\n/).flatten.map(&:to_i), done]
      end
    end
  end

  # This process holds a socket per stream, and so does a worker: the soft limit is raised for the
  # test if it must be (the server started here inherits it), and put back after.
  def setup
    soft, hard = Process.getrlimit(:NOFILE)
    return if soft >= FDS_NEEDED
    skip "RLIMIT_NOFILE #{soft}/#{hard}: #{FDS_NEEDED} descriptors needed for #{STREAMS} streams" if hard < FDS_NEEDED

    @nofile = [soft, hard]
    Process.setrlimit(:NOFILE, FDS_NEEDED, hard)
  end

  def teardown
    (@clients || []).each(&:close)
    super
  ensure
    Process.setrlimit(:NOFILE, *@nofile) if @nofile
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Two workers, --streams, listening on 127.0.0.1 and a UNIX socket, a status listener; the gate
  # (a FIFO) in the server's directory.
  def start(graceful)
    dir = Dir.mktmpdir("bb-test")
    @gate = File.join(dir, "gate")
    File.mkfifo(@gate)
    start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--stats-listen", "unix:#{dir}/status.sock",
                  "--streams", "--graceful-timeout", graceful.to_s, "--max-connections", MAX_CONNECTIONS.to_s],
                 app: "stream_faults.ru", workers: 2, dir: dir, env: { "BB_STREAM_GATE" => @gate })
  end

  # Every stream waiting at the gate goes on (a byte nobody reads: it stays open).
  def open_gate = File.open(@gate, File::WRONLY | File::NONBLOCK) { |f| f.write("1") }

  # One stream per kind given, each on a connection of its own, its request sent.
  def open_streams(server, kinds)
    clients = kinds.map do |kind, path|
      io = Socket.new(:INET, :STREAM)
      io.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, STALLED_RCVBUF) if kind == :stalled
      io.connect(Socket.sockaddr_in(server.tcp_port, server.tcp_host))
      io.write("GET #{path} HTTP/1.1\r\nHost: x\r\n\r\n")
      Client.new(io, kind)
    end
    (@clients ||= []).concat(clients)
    clients
  end

  # Reads what comes on the clients' sockets until the block says the state is reached.
  def pump(clients, what, timeout: WAIT)
    by_io = clients.to_h { |c| [c.io, c] }
    deadline = now + timeout
    until yield
      flunk "#{what}: not within #{timeout}s" if now > deadline
      open = clients.reject(&:idle?).map(&:io)
      ready, = IO.select(open, nil, nil, 0.2)
      ready&.each { |io| by_io[io].read_some }
    end
  end

  def fds(pid) = Dir.children("/proc/#{pid}/fd").size
  def threads(pid) = Dir.children("/proc/#{pid}/task").size
  def workers(server) = status_json(stats_path(server))["workers"]
  def streams_open(server) = workers(server).sum { |w| w["streams"] }

  # What a worker says of itself on a keep-alive connection it holds: [live fibers, bodies made, closed].
  def probe(io)
    res = Timeout.timeout(WAIT) { request(io, "GET", "/fibers") }
    assert_equal 200, res&.status
    res.body.scan(/(fibers|opened|closed)=(\d+)/).to_h.transform_values(&:to_i).values_at("fibers", "opened", "closed")
  end

  # A few streams of each fate, before the baseline: whatever a worker makes once, lazily, on its
  # first stream, its first vanished client or its first failing body is counted in it.
  def warm_up(server)
    clients = open_streams(server, Array.new(12) do |i|
      case i % 4
      when 0 then [:survive, "/sse?gate=0&pre=#{PRE}&post=1&gap=0.01"]
      when 1 then [:raise, "/raise?gate=0&pre=#{PRE}&gap=0.01"]
      else [:flowing, "/sse?gate=0&pre=#{PRE}&post=100000&gap=0.01"]
      end
    end)
    pump(clients, "the warm-up streams under way") { clients.all? { |c| c.events.size > PRE || c.ended } }
    clients.each_with_index { |c, i| c.vanish(i.odd?) if c.kind == :flowing }
    pump(clients, "the warm-up streams ended") { clients.all? { |c| c.ended || c.last_chunk? } }
    clients.each(&:close)
    wait_for(WAIT, "the warm-up streams closed") { streams_open(server).zero? }
  end

  # Each worker's [descriptors, threads] once the workers hold `connections` connections in all and run
  # no request (the closed ones' staged closes over), as their ticks after `since` show.
  def settled_counts(server, pids, since, connections: 0)
    status_after(stats_path(server), since, WAIT) do |s|
      s["totals"]["connections"] == connections && s["workers"].all? { |w| w["state"] == "idle" }
    end
    pids.to_h { |pid| [pid, [fds(pid), threads(pid)]] }
  end

  def test_vanishing_clients_and_failing_bodies_among_1000_streams_leak_nothing
    server = start(GRACEFUL)
    pids = server.worker_pids
    warm_up(server)
    baseline = settled_counts(server, pids, now)
    failed_before = log_count(server, FAILED)

    load = load_on(server, keepalive: 1, fresh: 1, downloads: 0)
    load.wait_ok(20)
    # By tens: 4 vanish at the gate (half with a reset), 1 vanishes while its events flow after it, 1
    # raises after it, 4 survive and get every event; but one in fifty stops reading a stream that
    # floods it, and vanishes at the gate too.
    kinds = Array.new(STREAMS) do |i|
      if i % 50 == 49 then [:stalled, "/flood?pre=#{PRE}"]
      elsif i % 10 < 4 then [:vanish, "/sse?pre=#{PRE}&post=#{POST}&gap=#{GAP}"]
      elsif i % 10 == 4 then [:flowing, "/sse?pre=#{PRE}&post=100000&gap=#{GAP}"]
      elsif i % 10 == 5 then [:raise, "/raise?pre=#{PRE}"]
      else [:survive, "/sse?pre=#{PRE}&post=#{POST}&gap=#{GAP}"]
      end
    end
    clients = open_streams(server, kinds)
    pump(clients, "every stream's first #{PRE} events") { clients.all? { |c| c.events.size >= PRE } }
    # (a worker counts a stream once its body waits: just after it wrote the events read here)
    wait_for(WAIT, "/status counting every open stream") { streams_open(server) == STREAMS }
    load.wait_ok(20) # answered while every stream is open

    # The flooded streams wait for their clients (their bytes are on the way, none spilled), and go with them.
    stalled = clients.select { |c| c.kind == :stalled }
    # (readable: bytes it has not read wait in its socket)
    wait_for(WAIT, "the stalled clients' buffers filling") { stalled.all? { |c| IO.select([c.io], nil, nil, 0) } }
    assert_equal [0], workers(server).map { |w| w["spill_bytes"] }.uniq, "a stalled client holds the high-water mark, no spill"
    vanish = clients.select { |c| c.kind == :vanish } + stalled
    vanish.each_with_index { |c, i| c.vanish(i.even?) }
    wait_for(WAIT, "the vanished clients' streams ended") { streams_open(server) == STREAMS - vanish.size }
    load.wait_ok(20)

    open_gate
    flowing = clients.select { |c| c.kind == :flowing }
    pump(clients, "the flowing streams past the gate") { flowing.all? { |c| c.events.size > PRE } }
    flowing.each_with_index { |c, i| c.vanish(i.even?) } # (mid-stream: theirs never end by themselves)
    survivors = clients.select { |c| c.kind == :survive }
    failing = clients.select { |c| c.kind == :raise }
    pump(clients, "the surviving streams' last chunks and the failing ones' ends") do
      survivors.all?(&:last_chunk?) && failing.all?(&:ended)
    end
    wait_for(WAIT, "no stream open") { streams_open(server).zero? }
    load.wait_ok(20)
    load.stop
    assert_nothing_lost(load)

    survivors.each { |c| assert_equal (1..PRE + POST).to_a, c.events, "a surviving stream gets every event" }
    assert_equal [nil], survivors.map(&:ended).uniq, "and its connection is kept alive"
    failing.each do |c|
      assert_equal (1..PRE).to_a, c.events
      refute c.last_chunk?, "a body that raised midway is cut short, not ended"
    end
    assert_equal STREAMS / 10, log_count(server, FAILED) - failed_before, "each failing body logged once"

    # One survivor's keep-alive connection per worker is kept to ask it (below; the streams are spread
    # over both workers, but nothing promises that each got a survivor); every other client goes. Each
    # worker holds its baseline's descriptors and that one more, before anything runs a GC (a connection
    # dropped without a close would be closed by a GC's finalizer: no leak then).
    probes = survivors.group_by(&:pid).transform_values(&:first)
    refute_empty probes
    (clients - probes.values).each(&:close)
    held = settled_counts(server, pids, now, connections: probes.size)
    assert_equal baseline.to_h { |pid, (f, t)| [pid, [f + (probes.key?(pid) ? 1 : 0), t]] }, held,
                 "each worker's [descriptors, threads] after the streams: its baseline's and the connection kept"
    # Each worker, on that connection: no stream fiber left alive, every body it made closed.
    probes.each do |pid, c|
      fibers, opened, closed = probe(c.io)
      assert_equal 0, fibers, "worker #{pid}: stream fibers left alive"
      assert_equal opened, closed, "worker #{pid}: stream bodies made and closed"
    end
    probes.each_value(&:close)
    after = settled_counts(server, pids, now)
    assert_equal baseline, after, "each worker's [descriptors, threads]: before the streams, and after"
    assert_equal pids, server.worker_pids, "no worker was replaced"
  end

  # TERM: each worker lets its streams run until graceful_timeout, then ends each (StreamStop where its
  # body waits): the client reads the last chunk and then the connection's end, not a reset. The master
  # exits 0 without killing a worker, and no process of the server is left.
  # Every held stream ends within `timeout`: a close (not a reset) after its last chunk, with the
  # events it had before the stop and no more.
  def all_ended_whole(clients, what, timeout)
    pump(clients, what, timeout: timeout) { clients.all?(&:ended) }
    assert_equal [:eof], clients.map(&:ended).uniq, "each stream ended with a close, not a reset"
    clients.each do |c|
      assert c.last_chunk?, "the last chunk came: #{c.data[-40..].inspect}"
      assert_equal (1..PRE).to_a, c.events
    end
  end

  def test_term_with_1000_open_streams_ends_each_with_its_last_chunk
    server = start(GRACEFUL)
    pids = server.worker_pids
    clients = open_streams(server, Array.new(STREAMS) { [:held, "/sse?pre=#{PRE}"] }) # (the gate never opens)
    pump(clients, "every stream's first #{PRE} events") { clients.all? { |c| c.events.size >= PRE } }
    wait_for(WAIT, "/status counting every open stream") { streams_open(server) == STREAMS }

    term = now
    server.signal(:TERM)
    all_ended_whole(clients, "every stream ended", GRACEFUL + STOP_MARGIN)
    first, last = clients.map { |c| c.ended_at - term }.minmax
    assert_operator first, :>=, GRACEFUL, "the streams ran until graceful_timeout"
    assert_operator last, :<=, GRACEFUL + STOP_MARGIN
    assert_equal 0, server.wait_exit(WAIT)&.exitstatus, "the master exits 0"
    assert_empty server.log.scan(/^.*still running after graceful_timeout.*$/), "no worker was killed"
    pids.each { |pid| refute alive?(pid), "worker #{pid} is gone" }
    refute server.group_alive?, "no process of the server's group is left"
  end

  # HUP (a re-exec) with 1,000 open streams: the new workers serve plain requests and new streams while
  # the old ones hold theirs; those end cleanly at graceful_timeout, and the old workers exit.
  def test_hup_with_1000_open_streams_hands_over_and_ends_the_old_streams_cleanly
    server = start(HUP_GRACEFUL)
    old = server.worker_pids
    load = load_on(server, keepalive: 1, fresh: 1, downloads: 0)
    load.wait_ok(20)
    clients = open_streams(server, Array.new(STREAMS) { [:held, "/sse?pre=#{PRE}"] }) # (the gate never opens)
    pump(clients, "every stream's first #{PRE} events") { clients.all? { |c| c.events.size >= PRE } }
    wait_for(WAIT, "/status counting every open stream") { streams_open(server) == STREAMS }

    server.signal(:HUP)
    wait_log(server, /new workers ready; 2 old workers finishing/, timeout: WAIT)
    handed_over = now
    fresh = server.worker_pids - old
    assert_equal 2, fresh.size, "two new workers"
    load.wait_ok(20)
    news = open_streams(server, Array.new(20) { [:new, "/sse?gate=0&pre=#{PRE}&post=#{POST}&gap=0.01"] })
    pump(clients + news, "the new streams' last chunks") { news.all?(&:last_chunk?) }
    assert_equal 0, clients.count(&:ended), "the old streams were still open meanwhile"
    news.each { |c| assert_equal (1..PRE + POST).to_a, c.events }
    assert_empty news.map(&:pid) - fresh, "the new streams were the new workers'"

    all_ended_whole(clients, "every old stream ended", HUP_GRACEFUL + STOP_MARGIN)
    # (the master tells the old workers to stop before it logs the handover the test waited for)
    assert_operator clients.map { |c| c.ended_at - handed_over }.min, :>=, HUP_GRACEFUL - 0.5,
                    "the old streams ran until graceful_timeout"
    wait_for(WAIT, "the old workers gone") { old.none? { |pid| alive?(pid) } }
    load.wait_ok(20)
    load.stop
    assert_nothing_lost(load)
    refute server.exited?
    assert_equal fresh, server.worker_pids - old
    assert_equal 0, streams_open(server)
  end
end
