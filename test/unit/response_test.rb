# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"
require "tmpdir"
require "fileutils"
require "timeout"

# Response (lib/blackbuck/worker/response.rb) without a worker: a real Native::Conn accepted from a
# UNIX listener in a temporary directory, the client end of it held by the test, which reads the
# bytes written; apps are lambdas; the logger records what it is told. Each test checks what
# #handle answers (DONE, WRITTEN, HIJACKED, CLOSE, DROP, RETIRE_*) and what reached the client.
class ResponseTest < Minitest::Test
  Native = Blackbuck::Native
  Response = Blackbuck::Response

  # The logger as Response calls it: [level, message, exception class].
  class FakeLogger
    attr_reader :lines

    def initialize = @lines = []
    def error(msg) = @lines << [:error, msg, nil]
    def exception(msg, err) = @lines << [:exception, msg, err.class]
  end

  OK = ->(_env) { [200, { "content-type" => "text/plain" }, ["hello"]] }
  GET = "GET /x?y=1 HTTP/1.1\r\nHost: example.com\r\n\r\n"
  DATE = /^Date: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT\r\n/
  ERROR_500 = "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 22\r\n" \
              "Connection: close\r\n\r\nInternal Server Error\n"

  def setup
    @config = Blackbuck::Config.new
    Native.configure(@config.values)
    @dir = Dir.mktmpdir("bb-response")
    @listener = UNIXServer.new("#{@dir}/s")
    @logger = FakeLogger.new
    @handed_over = []
    @clients = []
    @conns = []
  end

  def teardown
    @conns.each { |c| c.close unless c.closed? }
    @clients.each { |c| c.close unless c.closed? }
    @listener.close
    FileUtils.rm_rf(@dir)
  end

  def response(app, config = @config) = Response.new(config, app, @logger, ->(conn) { @handed_over << conn })

  # A connection whose request (raw bytes) has been read and parsed: [conn, env, client].
  def request(res, raw = GET)
    client = UNIXSocket.new("#{@dir}/s")
    @clients << client
    conn = Native::Conn.accept(@listener.fileno, res.env_defaults, false)
    @conns << conn
    client.write(raw)
    assert_equal raw.bytesize, conn.fill(1.0)
    env = conn.parse
    assert_kind_of Hash, env
    [conn, env, client]
  end

  # Runs the app for one request: [what #handle answered, the bytes the client got (Date taken out)].
  def serve(app, raw = GET, config: @config)
    res = response(app, config)
    conn, env, client = request(res, raw)
    mode = res.handle(conn, env)
    [mode, received(client)]
  end

  # What the client has been sent so far (all of it: #handle has written it), the Date field
  # taken out (test_an_array_body_is_done_with_its_length_and_keep_alive looks at it).
  def received(client, date: false)
    out = +""
    loop { out << client.read_nonblock(65_536) }
  rescue IO::WaitReadable, EOFError
    date ? out : out.gsub(DATE, "")
  end

  def test_the_outcomes_are_distinct_and_a_retiring_worker_keeps_each_ones_meaning
    outcomes = [Response::DONE, Response::WRITTEN, Response::HIJACKED, Response::CLOSE, Response::DROP,
                Response::RETIRE_WRITTEN, Response::RETIRE_CLOSE, Response::RETIRE_DROP]
    assert_equal %i[done written hijacked close drop retire_written retire_close retire_drop], outcomes
    assert_equal({ done: :retire_written, written: :retire_written, close: :retire_close, drop: :retire_drop,
                   hijacked: :hijacked, streaming: :retire_streaming }, Response::RETIRE)
    assert_equal :streaming, Response::STREAMING # (a stream's end maps its own mode: Response#finish_later)
  end

  def test_env_defaults_offer_hijack_and_response_finished_and_early_hints_only_when_configured
    defaults = response(OK).env_defaults
    assert_equal %w[rack.hijack rack.response_finished], defaults.keys
    assert_equal [], defaults["rack.response_finished"]
    assert defaults.frozen?
    @config.set(:early_hints, true)
    assert_equal %w[rack.hijack rack.response_finished rack.early_hints], response(OK).env_defaults.keys
  end

  def test_an_array_body_is_done_with_its_length_and_keep_alive
    res = response(OK)
    conn, env, client = request(res)
    assert_equal Response::DONE, res.handle(conn, env)
    out = received(client, date: true)
    assert_match(/\AHTTP\/1\.1 200 OK\r\ncontent-type: text\/plain\r\nContent-Length: 5\r\n#{DATE}\r\nhello\z/, out)
    refute conn.closed?
    assert_empty @logger.lines
  end

  def test_http_1_0_gets_connection_close_and_a_string_status_is_taken
    mode, out = serve(->(_env) { ["201", {}, %w[a b]] }, "GET / HTTP/1.0\r\n\r\n")
    assert_equal Response::DONE, mode
    assert_equal "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab", out
  end

  def test_head_sends_the_head_alone_and_never_iterates_the_body
    body = Struct.new(:iterated, :closed) do
      def each = (self.iterated = true)
      def close = (self.closed = true)
    end.new(false, false)
    mode, out = serve(->(_env) { [200, { "content-length" => "5" }, body] }, "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal Response::DONE, mode
    assert_equal "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", out
    refute body.iterated
    assert body.closed, "body.close is called"
  end

  def test_an_each_body_is_streamed_chunked_and_written
    app = ->(_env) { [200, {}, Enumerator.new { |y| y << "he" << "llo" }] }
    mode, out = serve(app)
    assert_equal Response::WRITTEN, mode
    assert_equal "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n", out
    mode, out = serve(app, "GET / HTTP/1.0\r\n\r\n")
    assert_equal Response::WRITTEN, mode
    assert_equal "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello", out, "HTTP/1.0: raw, ended by the close"
  end

  def test_a_callable_body_writes_to_a_stream
    mode, out = serve(->(_env) { [200, {}, ->(stream) { stream.write("ab") && stream << "cd" }] })
    assert_equal Response::WRITTEN, mode
    assert_equal "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n", out
  end

  # An app thread's Response with the streams setting (no Streams of its own) hands a streamed body
  # to the loop untouched: nothing written, not iterated, not closed, its callbacks not run yet, and
  # the retire a rescued notice asks for travels with it. An Array body is answered as always.
  def test_an_app_threads_response_hands_a_streamed_body_to_the_loop
    config = Blackbuck::Config.new
    config.set(:streams, true)
    body = Struct.new(:iterated, :closed) do
      def each = (self.iterated = true) && yield("x")
      def close = self.closed = true
    end.new
    ran = []
    app = lambda do |env|
      env["rack.response_finished"] << ->(*) { ran << :finished }
      [200, { "content-type" => "text/event-stream" }, body]
    end
    hand = response(app, config)
    conn, env, client = request(response(OK)) # (an app thread's env has no shared template entries)
    handed = hand.handle(conn, env)
    assert_kind_of Response::Handed, handed
    assert_same body, handed.body
    assert_equal [200, false], [handed.status, handed.retire]
    assert_equal 1, handed.finished.size, "the request's callbacks go with it"
    assert_empty ran
    refute body.iterated
    refute body.closed
    assert_equal "", received(client), "nothing written: the loop writes it"

    conn, env, client = request(response(OK))
    assert_equal Response::DONE, response(OK, config).handle(conn, env), "an Array body is no stream"
    assert_match(/hello\z/, received(client))
  end

  BIG = 2 * 1024 * 1024 # bytes: more than a UNIX socket's buffer, less than response_buffer

  def test_a_response_the_socket_cannot_take_at_once_is_written_and_queued
    res = response(->(_env) { [200, {}, ["y" * BIG]] })
    conn, env, client = request(res)
    assert_equal Response::WRITTEN, res.handle(conn, env)
    assert conn.pending_output?, "the rest waits in the connection's output queue"
    out = +""
    Timeout.timeout(30) do
      while conn.pending_output?
        out << client.readpartial(65_536)
        conn.flush # (the worker's loop does this when the socket is writable)
      end
    end
    out << received(client)
    head, body = out.gsub(DATE, "").split("\r\n\r\n", 2)
    assert_equal "HTTP/1.1 200 OK\r\nContent-Length: #{BIG}", head
    assert_equal "y" * BIG, body
  end

  def test_an_app_error_is_a_500_to_close_and_logged
    mode, out = serve(->(_env) { raise "boom" })
    assert_equal Response::CLOSE, mode
    assert_equal ERROR_500, out
    assert_equal [[:exception, "app error: GET /x", RuntimeError]], @logger.lines
  end

  def test_an_unsafe_error_is_answered_and_retires_the_worker
    mode, out = serve(->(_env) { exit 3 })
    assert_equal Response::RETIRE_CLOSE, mode
    assert_equal ERROR_500, out
    assert_equal [[:exception, "app error: GET /x (the worker is replaced after this request)", SystemExit]], @logger.lines
  end

  def test_a_request_timeout_in_the_app_is_a_503_and_retires_the_worker
    @config.set(:timeout, 7)
    mode, out = serve(->(_env) { raise Blackbuck::RequestTimeout, "late" })
    assert_equal Response::RETIRE_CLOSE, mode
    assert_equal "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 20\r\n" \
                 "Connection: close\r\n\r\nService Unavailable\n", out
    assert_equal [[:exception, "request timeout (7s): GET /x", Blackbuck::RequestTimeout]], @logger.lines
  end

  def test_a_timeout_the_app_rescued_is_answered_by_the_app_and_retires_the_worker
    @config.set(:timeout, 7)
    res = nil
    app = lambda do |_env|
      begin
        raise res.timeout_notice(7)
      rescue Blackbuck::RequestTimeout
        [503, {}, ["busy"]]
      end
    end
    res = response(app)
    conn, env, client = request(res)
    assert_equal Response::RETIRE_WRITTEN, res.handle(conn, env)
    assert_equal "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", received(client)
    assert_equal [[:exception, "request timeout (7s), rescued by the app: GET /x", Blackbuck::RequestTimeout]], @logger.lines
    res = response(OK)
    res.timeout_notice(7)
    conn, env, = request(res)
    assert_equal Response::DONE, res.handle(conn, env), "a notice the app never saw retires nothing"
  end

  def test_what_is_not_a_rack_response_is_a_500_naming_it
    { ->(_env) { [200, {}] } => "app returned an Array of 2, not [status, headers, body]: GET /x",
      ->(_env) { "ok" } => "app returned a String, not [status, headers, body]: GET /x",
      ->(_env) { ["abc", {}, []] } => 'app returned status "abc"; a Rack status is an integer 100..999: GET /x',
      ->(_env) { [1000, {}, []] } => "app returned status 1000; a Rack status is an integer 100..999: GET /x",
      ->(_env) { [200, {}, nil] } => "app returned a nil body; a Rack body responds to each or call: GET /x" }.each do |app, line|
      @logger.lines.clear
      mode, out = serve(app)
      assert_equal [Response::CLOSE, ERROR_500], [mode, out], line
      assert_equal [[:error, line, nil]], @logger.lines
    end
  end

  def test_a_body_failing_before_its_first_part_is_a_500_and_after_it_a_cut_response
    mode, out = serve(->(_env) { [200, {}, Enumerator.new { |_y| raise "early" }] })
    assert_equal [Response::CLOSE, ERROR_500], [mode, out]
    assert_equal [[:exception, "body failed before its first part: GET /x", RuntimeError]], @logger.lines
    @logger.lines.clear
    late = Enumerator.new do |y|
      y << "he"
      raise "late"
    end
    mode, out = serve(->(_env) { [200, {}, late] })
    assert_equal Response::CLOSE, mode
    assert_equal "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n", out, "no last chunk: the client sees it cut"
    assert_equal [[:exception, "body failed after the head was sent, connection closed: GET /x", RuntimeError]], @logger.lines
  end

  def test_a_client_gone_before_the_answer_is_dropped
    res = response(OK)
    conn, env, client = request(res)
    client.close
    assert_equal Response::DROP, res.handle(conn, env)
  end

  def test_rack_hijack_hands_the_socket_over_to_the_app
    taken = again = io_entry = told = nil
    res = response(lambda do |env|
      taken = env["rack.hijack"].call
      told = @handed_over.dup
      again = env["rack.hijack"].call
      io_entry = env["rack.hijack_io"]
      taken.write("raw bytes")
      [-1, {}, []] # not looked at: the app owns the socket
    end)
    conn, env, client = request(res)
    assert_equal Response::HIJACKED, res.handle(conn, env)
    assert_equal [conn], told, "the worker was told before the app got the socket"
    assert_instance_of UNIXSocket, taken
    assert_same taken, again, "a second call answers the same socket"
    assert_same taken, io_entry
    assert conn.closed?, "the connection no longer holds the descriptor"
    assert_includes Blackbuck::Hijacked.open, taken
    assert_equal "raw bytes", client.readpartial(100)
    taken.close
    assert_equal "", received(client)
  end

  def test_a_partial_hijack_writes_the_head_then_gives_the_socket_to_the_headers_callable
    app = ->(_env) { [101, { "upgrade" => "websocket", "rack.hijack" => ->(io) { io.write("frames") && io.close } }, []] }
    mode, out = serve(app)
    assert_equal Response::HIJACKED, mode
    assert_equal "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\nframes", out
  end

  def test_early_hints_go_before_the_response_when_configured
    @config.set(:early_hints, true)
    app = ->(env) { env["rack.early_hints"].call({ "link" => "</a.css>; rel=preload" }) && [200, {}, ["k"]] }
    mode, out = serve(app)
    assert_equal Response::DONE, mode
    assert_equal "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk", out
  end

  def test_response_finished_callbacks_run_after_the_answer_with_its_status_or_error
    seen = []
    record = ->(env, status, headers, error) { seen << [env["PATH_INFO"], status, headers, error&.message] }
    res = response(lambda do |env|
      env["rack.response_finished"] << record
      raise "boom" if env["PATH_INFO"] == "/fail"

      [200, { "a" => "b" }, ["ok"]]
    end)
    conn, env, = request(res)
    assert_equal Response::DONE, res.handle(conn, env)
    conn, env, = request(res, "GET /fail HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal Response::CLOSE, res.handle(conn, env)
    assert_equal [["/x", 200, { "a" => "b" }, nil], ["/fail", nil, nil, "boom"]], seen
    assert_equal [], env["rack.response_finished"], "emptied for the next request"
  end
end
