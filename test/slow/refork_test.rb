# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "open3"

# refork_after: a warm worker forks the mold and exits, new workers fork from the mold and replace
# the old generation one at a time, while clients on keep-alive connections never see a reset or a lost
# request; the mold is no point of failure; an app that is not fork-safe is never reforked. The
# blackbuck command's master never loads the app: a first mold boots it and forks generation 0.
class ReforkTest < ServerTest
  def start_reforking(counts, workers:, env: {}, app: "refork.ru", config: "")
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/refork.rb", "refork_after #{counts.join(', ')}\n#{config}")
    start_server(["-c", "#{dir}/refork.rb", "-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock",
                  "--stats-listen", "unix:#{dir}/status.sock"], app: app, workers: workers, dir: dir, env: env)
  end

  def status(server) = status_json(stats_path(server))

  # GET / on io: [pid that served it, pid that built its warm state, whether the server closes after it].
  def warm_get(io)
    res = request(io, "GET", "/")
    assert_equal 200, res.status
    [Integer(res.body[/pid=(\d+)/, 1]), Integer(res.body[/built_by=(\d+)/, 1]), res["connection"] == "close"]
  end

  # Until generation `gen` has a mold and all the server's workers are of that generation and serve
  # (idle or busy: not starting, and not the worker that forked a replacement mold on its way out).
  # All of them: between a worker's exit and its replacement's fork the table has one fewer (CI11
  # caught the status of that moment, 2 workers of 3).
  def wait_for_generation(server, gen, timeout = 60)
    wait_for(timeout, "every worker of refork generation #{gen}") do
      s = status(server)
      s if s.dig("refork", "generation") == gen && s.dig("refork", "mold") && s["workers"].size == server.workers &&
           s["workers"].all? { |w| w["generation"] == gen && %w[idle busy].include?(w["state"]) }
    end
  end

  # Keep-alive clients send requests one at a time through three reforks. A request is sent once:
  # a connection the server closes after an answer ("Connection: close", a retiring worker's last)
  # is opened again before the next; any reset, EOF instead of an answer, or non-200 is a failure.
  def test_three_reforks_under_keep_alive_load_lose_no_request
    loaded = File.join(Dir.mktmpdir("bb-test"), "loaded")
    server = start_reforking([100, 200, 300], workers: 3, env: { "REFORK_LOADED_LOG" => loaded })
    last, sent = through_reforks(server, 3) { server.unix }
    assert_operator sent, :>=, 300 * 3, "the clients drove every refork"
    assert_equal 3, server.log.scan(/refork: mold of generation [1-3] is pid \d+ \(forked by worker \d, pid \d+, which exits\)/).size
    booted = Integer(server.log[/refork: mold of generation 0 is pid (\d+) \(it booted the app\)/, 1])
    assert_equal [booted], File.read(loaded).split.map { |pid| Integer(pid) }, "the app was loaded once, by the first mold, not the master"
    assert_equal %w[master mold worker worker worker], last["processes"].map { |p| p["role"] }.sort
    assert(last["workers"].all? { |w| w["forked_by"] == "mold" && w["uss_kib"].is_a?(Integer) })
    # What the first mold built while it was a worker, every later generation has without building it.
    first_promoted = Integer(server.log[/refork: mold of generation 1 is pid \d+ \(forked by worker \d, pid (\d+)/, 1])
    io = server.tcp
    pid, built_by, = warm_get(io)
    refute_equal pid, built_by
    assert_equal first_promoted, built_by, "a worker of the mold answers with the warm state the worker that forked the first mold built"
  ensure
    io&.close
  end

  # The same behind nginx with upstream keep-alive: nginx reuses its connections to the workers
  # whichever worker has them, and never sees one closed under a request (its error log stays clean).
  def test_reforks_behind_nginx_with_upstream_keep_alive_lose_no_request
    skip "nginx is not installed" unless NginxProxy.available?
    server = start_reforking([100, 200], workers: 2)
    nginx = NginxProxy.new("unix:#{server.unix_path}")
    _, sent = through_reforks(server, 2) { TCPSocket.new("127.0.0.1", nginx.port) }
    assert_operator sent, :>=, 300
    assert_equal "", nginx.error_log.lines.grep(/\[(error|crit|alert)\]/).join, "nginx saw no upstream failure"
  ensure
    nginx&.stop
  end

  # Idle keep-alive connections of the workers being replaced move to their siblings: after a refork
  # has replaced every worker, each connection opened before it still answers its next request.
  def test_idle_keep_alive_connections_survive_the_refork
    server = start_reforking([30], workers: 2)
    idle = Array.new(6) { server.unix }
    before = idle.map { |io| warm_get(io).first }
    assert_operator before.uniq.size, :>=, 1
    wait_for(60, "a refork") do
      fresh_gets(server, 1)
      s = status(server)
      s["refork"]["generation"] == 1 && s["workers"].size == server.workers &&
        s["workers"].all? { |w| w["generation"] == 1 && w["state"] != "starting" }
    end
    after = idle.map do |io|
      warm_get(io).first
    rescue StandardError => e
      flunk "an idle connection opened before the refork failed: #{e.class}: #{e.message}\n#{server.log}"
    end
    assert_empty after & before, "every old worker is gone, so each connection moved to a new one"
    assert_match(/moved \d+ idle connections to its siblings/, server.log)
  ensure
    idle&.each(&:close)
  end

  # The master holds no app to fork from: a serving worker forks a new mold (the code the workers
  # run; the files on disk may be a deploy's, unchecked), in the same generation, and it forks the
  # replacement.
  def test_a_worker_forks_a_new_mold_when_the_mold_dies
    server = start_reforking([10], workers: 2)
    s = drive_to_generation(server, 1)
    mold = s.dig("refork", "mold", "pid")
    Process.kill(:KILL, mold)
    assert_logged(server, /mold \(pid #{mold}, generation 1\) killed by SIGKILL; workers fork from a new mold a worker forks/)
    assert_logged(server, /refork: mold of generation 1 is pid \d+ \(forked by worker \d, pid \d+, which exits\); it replaces the mold that is gone/)
    s = wait_for_generation(server, 1)
    victim = s["workers"].first["pid"]
    Process.kill(:KILL, victim)
    s = wait_for(30, "a replacement") do
      st = status(server)
      st if st["workers"].size == 2 && st["workers"].none? { |w| w["pid"] == victim } &&
            st["workers"].all? { |w| w["state"] != "starting" }
    end
    assert_equal %w[mold mold], s["workers"].map { |w| w["forked_by"] }
    new_mold = s.dig("refork", "mold")
    refute_equal mold, new_mold["pid"]
    assert_equal [false, 1], new_mold.values_at("booted_app", "generation"), "a worker forked the new mold: #{new_mold}"
    refute_match(/booting the app/, server.log.split(/killed by SIGKILL/, 2).last)
    assert_serves(server)
  end

  # A mold that does not answer (stopped) is given FORK_SECONDS, then killed (the master's loop goes
  # on meanwhile: faults/mold_test.rb); a new one takes its place.
  def test_a_mold_that_does_not_answer_is_replaced
    server = start_reforking([10], workers: 2)
    s = drive_to_generation(server, 1)
    mold = s.dig("refork", "mold", "pid")
    Process.kill(:STOP, mold)
    victim = s["workers"].first["pid"]
    Process.kill(:KILL, victim)
    assert_logged(server, /the mold \(pid #{mold}\) could not fork worker \d \(no answer in \d+s\); a new mold takes its place/, 30)
    s = wait_for(30, "a replacement forked by a new mold") do
      st = status(server)
      st if st.dig("refork", "mold") && st.dig("refork", "mold", "pid") != mold && st["workers"].size == 2 &&
            st["workers"].none? { |w| w["pid"] == victim } && st["workers"].all? { |w| w["state"] != "starting" }
    end
    refute_equal mold, s.dig("refork", "mold", "pid")
    wait_for(15, "the stopped mold killed") { !alive?(mold) }
    assert_serves(server)
  ensure
    kill_if_alive(mold)
  end

  # HUP loads new code: the mold (old code) goes, and the new image's workers fork from a mold that
  # boots it.
  def test_hup_ends_the_mold
    server = start_reforking([10], workers: 2)
    s = drive_to_generation(server, 1)
    mold = s.dig("refork", "mold", "pid")
    old = s["workers"].map { |w| w["pid"] }
    server.signal(:HUP)
    assert_logged(server, /mold \(pid #{mold}\) stopping: HUP/)
    s = wait_for(60, "the new image's workers") do
      st = status(server)
      st if st["workers"].size == 2 && (st["workers"].map { |w| w["pid"] } & old).empty? &&
            st["workers"].all? { |w| w["state"] != "starting" }
    end
    assert_equal 0, s.dig("refork", "generation")
    assert_equal %w[mold mold], s["workers"].map { |w| w["forked_by"] }
    refute_equal mold, s.dig("refork", "mold", "pid")
    assert_equal true, s.dig("refork", "mold", "booted_app")
    wait_for(15, "the old mold gone") { !alive?(mold) }
    assert_serves(server)
  end

  # A WebSocket the app took over in the worker that forks the mold stays that worker's: the mold
  # closes its copy (and has none of the app's threads), so no process the mold forks can write to
  # it, and the client sees it close when the worker exits, as with any retiring worker.
  def test_the_mold_holds_no_websocket_of_the_worker_that_forked_it
    server = start_reforking([10], workers: 1, app: "websocket.ru")
    ws = server.tcp
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    ws.write("GET /partial HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" \
             "Sec-WebSocket-Key: #{key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = +""
    head << ws.readpartial(4096) until head.include?("\r\n\r\n")
    assert_match(%r{\AHTTP/1\.1 101 }, head)
    assert_equal "echo:before", ws_echo(ws, "before")
    holder = server.worker_pids.first
    wait_for(60, "refork generation 1") do
      io = server.tcp
      assert_equal 200, request(io, "GET", "/").status
      io.close
      s = status(server)
      s.dig("refork", "generation") == 1 && s["workers"].size == server.workers &&
        s["workers"].all? { |w| w["generation"] == 1 && w["state"] != "starting" }
    end
    assert_match(/mold \(pid \d+\) ready.*; closed its copies of 1 connections the app took over/, server.log)
    wait_for(30, "the worker that forked the mold gone") { !alive?(holder) }
    rest = begin
      ws.wait_readable(30) ? ws.read : :still_open
    rescue Errno::ECONNRESET
      ""
    end
    assert_equal "", rest, "no process holds the WebSocket once its worker exits (none answers on it)"
  ensure
    ws&.close
  end

  # The streams setting: the worker told to fork the mold stops, lets its open streams run until
  # graceful_timeout, then ends each with its last chunk (StreamStop) before it forks: the mold holds
  # no stream's socket, and the workers forked from it serve. (The streams wait behind the gate of
  # streams.ru, which is never opened: their end is the stop's.)
  def test_a_worker_that_forks_the_mold_ends_its_streams_first
    server = start_reforking([10], workers: 1, app: "streams.ru", config: "streams true\ngraceful_timeout 2\n")
    last_chunk = "0\r\n\r\n"
    streams = Array.new(2) do
      io = server.tcp
      io.write("GET /sse?n=3&gap=0.01&gated=1 HTTP/1.1\r\nHost: x\r\n\r\n")
      data = +""
      Timeout.timeout(30) { data << io.readpartial(65_536) until data.include?("data: 2\n\n") }
      [io, data]
    end
    holder = server.worker_pids.first
    wait_for(60, "the worker told to fork the mold") do
      assert_serves(server) unless server.log.include?("forks the mold")
      server.log.match?(/worker 0 \(pid #{holder}\) stopping: forking the mold/)
    end
    streams.each do |io, data|
      Timeout.timeout(30) { data << io.readpartial(65_536) until data.include?(last_chunk) }
      refute_includes data, "data: 3", "ended by the stop, not by its body (the gate is shut)"
    end
    assert_logged(server, /worker 0 \(pid #{holder}\) forks the mold after/)
    mold = wait_for(60, "the mold") { status(server).dig("refork", "mold", "pid") }
    ports = streams.map { |io, _| io.local_address.ip_port }
    assert_empty client_sockets(mold, ports), "the mold holds none of the streams' connections"
    wait_for_generation(server, 1)
    assert_serves(server)
  ensure
    streams&.each { |io, _| io.close }
  end

  # The TCP sockets process pid holds whose peer is one of these local ports (/proc: its fds' socket
  # inodes, matched to /proc/net/tcp's rows).
  def client_sockets(pid, ports)
    inodes = Dir.children("/proc/#{pid}/fd").filter_map do |fd|
      File.readlink("/proc/#{pid}/fd/#{fd}")[/\Asocket:\[(\d+)\]\z/, 1]
    rescue Errno::ENOENT
      nil
    end
    File.readlines("/proc/net/tcp").drop(1).filter_map do |row|
      f = row.split
      f if inodes.include?(f[9]) && ports.include?(f[2].split(":")[1].to_i(16))
    end
  end

  # `blackbuck status` says the generation, the mold and what each process costs.
  def test_the_status_command_shows_the_generation_the_mold_and_memory
    server = start_reforking([10], workers: 2)
    s = drive_to_generation(server, 1)
    out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status", "unix:#{stats_path(server)}")
    assert st.success?, err
    assert_match(/^refork: generation 1, mold pid #{s.dig('refork', 'mold', 'pid')}$/, out)
    assert_match(/^memory \(USS\): master \d+\.\d MiB, mold \d+\.\d MiB, 2 workers \d+\.\d MiB; total PSS \d+\.\d MiB$/, out)
    assert_match(/^WORKER\s+PID\s+STATE\s+REQUESTS\s+CONNS\s+STREAMS\s+CURRENT\s+RUNNING\s+HEARTBEAT\s+GEN\s+USS$/, out)
    assert_equal 2, out.lines.grep(/^\d+\s+\d+\s+\w+\s.*\s1\s+\d+\.\d MiB$/).size, "both workers of generation 1, with their USS:\n#{out}"
  end

  def test_an_app_that_is_not_fork_safe_is_never_reforked
    server = start_reforking([5], workers: 2, env: { "REFORK_UNSAFE" => "1" })
    pids = server.worker_pids
    fresh_gets(server, 20)
    assert_logged(server, /refork: worker \d \(pid \d+\) is not fork-safe \(the test app said so \(REFORK_UNSAFE\)\); reforking is off/, 30)
    fresh_gets(server, 20)
    s = status(server)
    assert_equal 0, s.dig("refork", "generation")
    assert_equal [0, true], [s.dig("refork", "mold", "generation"), s.dig("refork", "mold", "booted_app")],
                 "the mold that booted the app stays the only one"
    assert_equal pids.sort, s["workers"].map { |w| w["pid"] }.sort, "no worker was replaced"
    refute_match(/forks the mold of generation 2|refork: mold of generation [1-9]/, server.log)
  end

  private

  # One masked text frame (RFC 6455) out; the payload of the text frame that comes back.
  def ws_echo(io, text)
    mask = [1, 2, 3, 4]
    io.write([0x81, 0x80 | text.bytesize, *mask].pack("C6") + text.bytes.each_with_index.map { |b, i| b ^ mask[i % 4] }.pack("C*"))
    _b0, len = io.read(2).unpack("CC")
    io.read(len)
  end

  # n GETs, each on a new connection (they go to whichever worker accepts).
  def fresh_gets(server, n)
    n.times do
      io = server.tcp
      warm_get(io)
    ensure
      io&.close
    end
  end

  def assert_serves(server)
    io = server.tcp
    assert_equal 200, request(io, "GET", "/").status
  ensure
    io&.close
  end

  # Four keep-alive clients (connections from the block) send GET / one at a time until generation
  # gen has replaced every worker. Returns [that /status, requests sent]; fails on any failed request.
  def through_reforks(server, gen)
    stop = false
    failures = Queue.new
    counts = Queue.new
    clients = Array.new(4) do
      Thread.new do
        sent = 0
        io = yield
        until stop
          begin
            sent += 1
            *, closing = warm_get(io)
          rescue StandardError, Minitest::Assertion => e
            failures << "request #{sent}: #{e.class}: #{e.message}"
            break
          end
          next unless closing

          io.close
          io = yield
        end
        counts << sent
      ensure
        io&.close
      end
    end
    last = wait_for_generation(server, gen, 90)
    stop = true
    clients.each(&:join)
    assert_empty Array.new(failures.size) { failures.pop }, "no request failed:\n#{server.log}"
    [last, Array.new(counts.size) { counts.pop }.sum]
  ensure
    stop = true
  end

  # Requests on fresh connections until generation gen has a mold and only its workers.
  def drive_to_generation(server, gen)
    wait_for(60, "refork generation #{gen}") do
      fresh_gets(server, 1)
      s = status(server)
      s if s.dig("refork", "generation") == gen && s.dig("refork", "mold") && s["workers"].size == server.workers &&
           s["workers"].all? { |w| w["generation"] == gen && %w[idle busy].include?(w["state"]) }
    end
  end
end
