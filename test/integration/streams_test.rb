# frozen_string_literal: true

require "open3"
require_relative "../test_helper"

# Long streams with the streams setting (issue 35, step 1; docs/ARCHITECTURE.md, "Long streams"): one
# worker, one app thread, and bodies that wait between their parts (test/apps/streams.ru). A gated
# stream's last part waits for GET /release, so "the streams are still open" is a state the test
# holds, not a time it hopes for: a plain request answered before the release was answered while
# every stream waited. Without the setting the first stream holds the worker and these tests fail.
class StreamsTest < ServerTest
  WAIT = 30 # seconds a read waits at most: a bound for a stuck server, not a measure of speed
  LAST_CHUNK = "0\r\n\r\n"

  TIMEOUT = 1 # --timeout: the request timeout (the app's time: app.call, and each run of a stream's fiber)

  def setup
    @server = start_both(["--streams", "--graceful-timeout", "2", "--timeout", TIMEOUT.to_s], app: "streams.ru", stats: true)
  end

  # A client of one streamed response: what it has read so far.
  class Reader
    attr_reader :data, :io

    def initialize(io)
      @io = io
      @data = +""
      @reset = false
    end

    # Reads until `text` has come; raises Timeout::Error after WAIT.
    def until(text)
      Timeout.timeout(WAIT) { @data << @io.readpartial(65_536) until @data.include?(text) }
      self
    end

    # Reads until the server closes: true when it closed (EOF), false on a reset.
    def to_end
      Timeout.timeout(WAIT) { loop { @data << @io.readpartial(65_536) } }
    rescue EOFError
      true
    rescue Errno::ECONNRESET
      false
    end
  end

  def open_stream(path)
    io = @server.tcp
    io.write("GET #{path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
    Reader.new(io)
  end

  def plain_get(path = "/")
    io = @server.tcp
    res = Timeout.timeout(WAIT) { request(io, "GET", path) }
    assert_equal 200, res&.status, "GET #{path} answered"
    res
  ensure
    io&.close
  end

  # A chunked body's bytes.
  def dechunk(data)
    out = +""
    until data.start_with?("0\r\n")
      size, data = data.split("\r\n", 2)
      out << data.byteslice(0, size.to_i(16))
      data = data.byteslice(size.to_i(16) + 2..)
    end
    out
  end

  def worker_pid = @server.worker_pids.first
  def fds = Dir.children("/proc/#{worker_pid}/fd").size
  def stats = plain_get("/stats").body[/closed=(\d+) finished=(\d+) late=(\d+)/].then { [Integer($1), Integer($2), Integer($3)] }
  def worker_status = status_json(stats_path(@server))["workers"].first

  def test_many_streams_receive_every_event_while_plain_requests_are_answered
    streams = Array.new(20) { open_stream("/sse?n=4&gap=0.02&gated=1") }
    streams.each { |s| s.until("data: 3\n\n") } # each waits behind the gate now
    3.times { assert_equal "hello\n", plain_get.body }
    status = worker_status
    assert_equal 20, status["streams"], "/status counts the open streams"
    assert_equal "idle", status["state"], "the worker is free while its streams wait"
    assert_match(/^blackbuck_streams\{worker="0"\} 20$/, stats_get(stats_path(@server), "/metrics"))
    out, err, st = Open3.capture3(RbConfig.ruby, EXE, "status", "unix:#{stats_path(@server)}")
    assert st.success?, err
    assert_match(/  streams 20  /, out, "blackbuck status: the totals")
    assert_match(/^WORKER\s+PID\s+STATE\s+REQUESTS\s+CONNS\s+STREAMS\s+CURRENT/, out)
    assert_match(/^0\s+#{worker_pid}\s+idle\s+\d+\s+\d+\s+20\s+-\s/, out, "and the worker's row")
    refute(streams.any? { |s| s.data.include?("data: 4") }, "no stream ended before the plain requests were answered")

    plain_get("/release")
    streams.each do |s|
      s.until(LAST_CHUNK)
      assert_equal (1..4).map { |i| "data: #{i}\n\n" }.join, s.data.split("\r\n\r\n", 2)[1].scan(/data: \d\n\n/).join
    end
    wait_for(WAIT, "the streams counted as ended") { worker_status["streams"].zero? }
  ensure
    streams&.each { |s| s.io.close }
  end

  def test_a_live_style_body_pops_a_queue_another_thread_pushes
    live = open_stream("/live?n=3&gap=0.01&gated=1").until("data: 2\n\n")
    assert_equal "hello\n", plain_get.body, "answered while the body waits in Queue#pop"
    plain_get("/release")
    live.until(LAST_CHUNK)
    assert_includes live.data, "data: 3\n\n"
  ensure
    live&.io&.close
  end

  def test_a_callable_body_sleeps_between_writes
    call = open_stream("/call?n=3&gap=0.01&gated=1").until("part 2\n")
    assert_equal "hello\n", plain_get.body, "answered while the callable body waits"
    plain_get("/release")
    call.until(LAST_CHUNK)
    assert_includes call.data, "part 3\n"
  ensure
    call&.io&.close
  end

  def test_a_client_that_vanishes_mid_stream_leaks_nothing
    closed, = stats
    before = fds
    streams = Array.new(5) { open_stream("/sse?n=3&gated=1").until("data: 2\n\n") }
    wait_for(WAIT, "the streams open") { worker_status["streams"] == 5 }
    streams.each { |s| s.io.close }
    wait_for(WAIT, "the vanished clients' streams ended") { worker_status["streams"].zero? }
    wait_for(WAIT, "their bodies closed") { stats[0] == closed + 5 }
    # (at most: the connection of the /stats request before `before` may still have been closing then)
    wait_for(WAIT, "the worker's descriptors back to #{before}") { fds <= before }
  end

  def test_a_body_that_raises_midway_cuts_the_stream_and_the_worker_serves_on
    failing = open_stream("/raise?gated=1").until("data: 1\n\n")
    assert_equal "hello\n", plain_get.body, "answered while the failing body waits"
    plain_get("/release")
    failing.to_end
    refute_includes failing.data, LAST_CHUNK, "a body that failed midway is cut short, not ended"
    assert_logged(@server, /body failed after the head was sent/)
    assert_equal "hello\n", plain_get.body
  ensure
    failing&.io&.close
  end

  def test_term_ends_open_streams_with_their_last_chunk
    streams = Array.new(3) { open_stream("/sse?n=100000&gap=0.05").until("data: 2\n\n") }
    assert_equal "hello\n", plain_get.body
    @server.signal(:TERM)
    streams.each do |s|
      assert s.to_end, "the stream ended with a close, not a reset"
      assert s.data.end_with?(LAST_CHUNK), "the stream's last chunk came: #{s.data[-40..].inspect}"
    end
    refute_nil @server.wait_exit(WAIT), "the server exited"
  ensure
    streams&.each { |s| s.io.close }
  end

  # A fast body to a client that reads nothing: the body waits once STREAM_HIGH_WATER is queued (the
  # worker spills nothing and serves on), and goes on as the client reads.
  def test_a_slow_reader_of_a_fast_stream_holds_the_high_water_mark_not_the_body
    big = open_stream("/big?n=200") # 12.5 MiB, ten times response_buffer
    wait_for(WAIT, "the stream waiting for its client") { worker_status["streams"] == 1 }
    assert_equal "hello\n", plain_get.body
    status = worker_status
    assert_equal 1, status["streams"], "the stream still waits for its client"
    assert_equal 0, status["spill_bytes"], "nothing past the high-water mark was queued"
    big.until(LAST_CHUNK)
    assert_equal 200 * 65_536, dechunk(big.data.split("\r\n\r\n", 2)[1]).bytesize
  ensure
    big&.io&.close
  end

  # A rack.response_finished callback the body adds while it streams runs when its own stream ends,
  # not with the callbacks of a request served meanwhile.
  def test_a_callback_added_mid_stream_runs_when_its_stream_ends
    stream = open_stream("/late-callback?gated=1&gap=0.01").until("data: 2\n\n") # (the callback is added)
    assert_equal "hello\n", plain_get.body, "a request served while the stream waits"
    assert_equal 0, stats[2], "the late callback did not run with another request's"
    plain_get("/release")
    stream.until(LAST_CHUNK)
    wait_for(WAIT, "the late callback run once its stream ended") { stats[2] == 1 }
  ensure
    stream&.io&.close
  end

  # The request timeout counts a stream's run: a body that spins past it after its head went out is
  # cut (no last chunk: a 503 cannot follow the head), and the worker is replaced; the loop survives.
  def test_a_run_past_the_timeout_cuts_the_stream_and_replaces_the_worker
    old = worker_pid
    spin = open_stream("/spin?gap=0.01").until("data: 1\n\n")
    spin.to_end
    refute_includes spin.data, LAST_CHUNK, "cut short, not ended"
    assert_logged(@server, %r{request timeout \(#{TIMEOUT}s\) while writing: GET /spin})
    wait_for(WAIT, "a fresh worker") { (@server.worker_pids - [old]).any? }
    assert_logged(@server, /worker 0 \(pid #{old}\) exited with status 0/) # (it stopped, it did not crash)
    refute_match(/\[BUG\]/, @server.log)
    assert_equal "hello\n", plain_get.body
  ensure
    spin&.io&.close
  end

  # An app that rescues the notice inside app.call and returns a stream body: the worker is replaced
  # all the same (as after a response that is not a stream), and the stream ends with its stop.
  def test_an_app_that_rescues_the_timeout_and_streams_is_replaced
    old = worker_pid
    stream = open_stream("/rescue-then-stream").until("data: 1\n\n")
    assert_logged(@server, %r{request timeout \(#{TIMEOUT}s\), rescued by the app: GET /rescue-then-stream})
    wait_for(WAIT, "a fresh worker") { (@server.worker_pids - [old]).any? }
    stream.until(LAST_CHUNK) # (its worker's stop ended it: graceful_timeout, then StreamStop)
    refute_includes stream.data, "data: 2", "ended by the stop, not by its body"
    after_the_stop_ended_it(stream)
  ensure
    stream&.io&.close
  end

  # The stream's head was out before its worker began to retire: its keep-alive connection moved on.
  def after_the_stop_ended_it(stream)
    res = Timeout.timeout(WAIT) { request(stream.io, "GET", "/") }
    assert_equal "hello\n", res&.body, "the next request on the stream's connection, served by the fresh worker"
  end

  # A body that waits before its first part sends its head at that first wait: the client (an
  # EventSource) sees the response open, and a proxy's idle timer restarts, before the first event.
  def test_a_body_that_waits_before_its_first_part_sends_its_head_then
    stream = open_stream("/sse?n=2&gap=0.01&late=1").until("\r\n\r\n")
    assert_match(%r{\AHTTP/1\.1 200 OK\r\n.*text/event-stream}m, stream.data)
    refute_includes stream.data, "data:", "the head came before any event"
    plain_get("/release")
    stream.until(LAST_CHUNK)
    assert_equal "data: 1\n\ndata: 2\n\n", dechunk(stream.data.split("\r\n\r\n", 2)[1])
  ensure
    stream&.io&.close
  end

  def test_keep_alive_after_a_stream
    stream = open_stream("/sse?n=3&gap=0.01&gated=1").until("data: 2\n\n")
    assert_equal "hello\n", plain_get.body
    plain_get("/release")
    stream.until(LAST_CHUNK)
    refute_match(/connection: close/i, stream.data.split("\r\n\r\n", 2)[0])
    res = Timeout.timeout(WAIT) { request(stream.io, "GET", "/") }
    assert_equal "hello\n", res&.body, "the next request on the stream's connection"
  ensure
    stream&.io&.close
  end
end

# The same with app threads (issue 35, step 2): an app thread hands its streamed body to the loop's
# thread (Response::Handed; AppRunner::Threads#finished) and is free again, so 20 open streams hold
# none of the 3 threads; a stream's run is timed on the loop's thread as a request is on an app
# thread. Without the hand-over the streams hold the threads and the plain requests wait.
class StreamsThreadsTest < StreamsTest
  THREADS = 3

  def setup
    @server = start_both(["--streams", "--threads", THREADS.to_s, "--graceful-timeout", "2", "--timeout", TIMEOUT.to_s],
                         app: "streams.ru", stats: true)
  end

  # As with one thread, but the notice reached an app thread, and the loop retires the worker as soon
  # as its turn ends (AppRunner::Threads#time_out: it need not wait for that request), which may come
  # before or after the turn that writes the stream's head: a head written after says "Connection:
  # close", and its connection closes once the stop has ended the stream; one written before keeps
  # the connection alive, as with one thread.
  def after_the_stop_ended_it(stream)
    return super unless stream.data.split("\r\n\r\n", 2)[0].match?(/^connection: close\r$/i)

    assert stream.to_end, "closed after its last chunk, not reset"
    assert_equal "hello\n", plain_get.body, "served by the fresh worker"
  end
end
