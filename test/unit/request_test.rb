# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"
require "tmpdir"
require "fileutils"
require "timeout"
require "minitest/mock"

# Request (lib/blackbuck/worker/request.rb) without a worker: a real Native::Conn accepted from a
# UNIX listener in a temporary directory, the test writing the client's bytes and calling
# Conn#fill and Request#advance as Connections#progress does. Each test checks what #advance
# answers (an env, a status to reject with, HEAD, BODY, PROXY_PART, PROXY, DROP) and the env's
# rack.input.
class RequestTest < Minitest::Test
  Native = Blackbuck::Native
  Request = Blackbuck::Request

  # The logger as Request calls it.
  class FakeLogger
    attr_reader :errors

    def initialize = @errors = []
    def error(msg) = @errors << msg
  end

  def setup
    @config = Blackbuck::Config.new
    @dir = Dir.mktmpdir("bb-request")
    @listener = UNIXServer.new("#{@dir}/s")
    @logger = FakeLogger.new
    @clients = []
    @conns = []
  end

  def teardown
    @conns.each { |c| c.close unless c.closed? }
    @clients.each(&:close)
    @listener.close
    Native.configure(Blackbuck::Config.new.values)
    FileUtils.rm_rf(@dir)
  end

  # The Request under test, after any settings (and C's connection settings from the same Config).
  def start(**settings)
    settings.each { |k, v| @config.set(k, v) }
    Native.configure(@config.values)
    @request = Request.new(@config, @logger)
    @template = @config[:threads] > 1 ? {}.freeze : @request.env_defaults
    @request
  end

  # A new connection (proxy: on a PROXY protocol listener): [conn, client].
  def connect(proxy: false)
    client = UNIXSocket.new("#{@dir}/s")
    @clients << client
    conn = Native::Conn.accept(@listener.fileno, @template, false, proxy)
    @conns << conn
    [conn, client]
  end

  # The client sends bytes; the connection reads them and the Request says what they make
  # (body: the connection is reading a body, as Connections passes it).
  def advance(conn, client, bytes, body: false)
    client.write(bytes)
    Timeout.timeout(10) { sleep 0.001 until conn.fill(1.0) }
    @request.advance(conn, body)
  end

  def post(length, more = "") = "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: #{length}\r\n#{more}\r\n"

  # Body tempfiles this process holds open (unlinked, they are only in /proc/self/fd).
  def spill_files
    Dir.children("/proc/self/fd").count do |fd|
      File.readlink("/proc/self/fd/#{fd}").include?("blackbuck-body")
    rescue SystemCallError
      false
    end
  end

  def test_a_whole_head_without_a_body_is_its_env_with_the_shared_empty_input
    start
    conn, client = connect
    env = advance(conn, client, "GET /a/b?q=1 HTTP/1.1\r\nHost: example.com:8080\r\nX-Foo: bar\r\n\r\n")
    assert_instance_of Hash, env
    assert_equal %w[GET /a/b q=1 /a/b?q=1 example.com 8080 bar HTTP/1.1],
                 env.values_at("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REQUEST_URI", "SERVER_NAME", "SERVER_PORT",
                               "HTTP_X_FOO", "SERVER_PROTOCOL")
    assert_same @template["rack.input"], env["rack.input"], "the template's one input"
    assert_equal "", env["rack.input"].read
    assert_nil @request.take_spilled
  end

  def test_an_input_the_app_closed_is_replaced_for_the_next_request
    start
    conn, client = connect
    first = advance(conn, client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")["rack.input"]
    first.close
    second = advance(conn, client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")["rack.input"]
    refute_same first, second
    refute second.closed?
    assert_equal "", second.read
    third = advance(conn, client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")["rack.input"]
    assert_same second, third, "kept while the app leaves it open"
  end

  def test_with_app_threads_each_request_has_its_own_input
    start(threads: 2)
    conn, client = connect
    a = advance(conn, client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")["rack.input"]
    b = advance(conn, client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")["rack.input"]
    refute_same a, b
    assert_equal ["", ""], [a.read, b.read]
  end

  def test_a_head_in_parts_waits_for_the_rest
    start
    conn, client = connect
    assert_equal Request::HEAD, advance(conn, client, "GET /slow HTTP/1.1\r\nHo")
    assert_equal Request::HEAD, advance(conn, client, "st: x\r\n")
    assert_equal "/slow", advance(conn, client, "\r\n")["PATH_INFO"]
  end

  def test_a_body_in_parts_is_read_into_memory_under_body_buffer
    start
    conn, client = connect
    assert_equal Request::BODY, advance(conn, client, "#{post(11)}hello")
    env = advance(conn, client, " world", body: true)
    assert_instance_of StringIO, env["rack.input"]
    assert_equal ["hello world", "11"], [env["rack.input"].read, env["CONTENT_LENGTH"]]
    assert_nil @request.take_spilled
  end

  def test_a_body_past_body_buffer_goes_to_an_unlinked_tempfile_the_worker_takes
    start(body_buffer: 16)
    conn, client = connect
    body = "x" * 100
    env = advance(conn, client, post(100) + body)
    input = env["rack.input"]
    assert_instance_of Tempfile, input
    assert_nil input.path, "unlinked: no name left behind"
    assert_equal body, input.read
    assert_same input, @request.take_spilled
    assert_nil @request.take_spilled, "taken once"
    input.close!
  end

  def test_a_chunked_body_is_decoded_spilled_once_past_body_buffer_and_given_its_length
    start(body_buffer: 16)
    conn, client = connect
    head = "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    before = spill_files
    assert_equal Request::BODY, advance(conn, client, "#{head}a\r\n0123456789\r\n")
    assert_equal before, spill_files, "10 bytes fit in memory"
    assert_equal Request::BODY, advance(conn, client, "a\r\nabcdefghij\r\n", body: true)
    assert_equal before + 1, spill_files, "past body_buffer: the body so far went to a tempfile"
    env = advance(conn, client, "0\r\n\r\n", body: true)
    assert_equal ["0123456789abcdefghij", "20"], [env["rack.input"].read, env["CONTENT_LENGTH"]]
    assert_same env["rack.input"], @request.take_spilled
    env["rack.input"].close!
  end

  def test_a_declared_length_over_max_body_is_413_before_any_body
    start(max_body: 10)
    conn, client = connect
    assert_equal 413, advance(conn, client, post(11))
    conn2, client2 = connect
    assert_equal "abcdefghij", advance(conn2, client2, "#{post(10)}abcdefghij")["rack.input"].read, "10 bytes is the limit"
  end

  def test_a_chunked_body_growing_past_max_body_is_413
    start(max_body: 10)
    conn, client = connect
    head = "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert_equal Request::BODY, advance(conn, client, "#{head}8\r\n01234567\r\n")
    assert_equal 413, advance(conn, client, "3\r\nabc\r\n", body: true)
  end

  def test_what_is_not_a_valid_head_or_chunk_is_the_status_to_reject_with
    start(max_uri: 64)
    conn, client = connect
    assert_equal 400, advance(conn, client, "NOT HTTP AT ALL\r\n\r\n")
    conn, client = connect
    assert_equal 414, advance(conn, client, "GET /#{'a' * 100} HTTP/1.1\r\nHost: x\r\n\r\n")
    conn, client = connect
    head = "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert_equal 400, advance(conn, client, "#{head}zz\r\nnot a chunk size\r\n")
  end

  def test_expect_100_continue_is_answered_before_the_body_is_read
    start
    conn, client = connect
    assert_equal Request::BODY, advance(conn, client, post(5, "Expect: 100-continue\r\n"))
    assert_equal "HTTP/1.1 100 Continue\r\n\r\n", client.read_nonblock(100)
    assert_equal "hello", advance(conn, client, "hello", body: true)["rack.input"].read
  end

  def test_a_proxy_protocol_header_comes_first_and_names_the_client
    start
    conn, client = connect(proxy: true)
    assert_equal Request::PROXY_PART, advance(conn, client, "PROXY TCP4 203.0.113.7 ")
    assert_equal Request::PROXY, advance(conn, client, "192.0.2.1 51000 80\r\n")
    env = advance(conn, client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal "203.0.113.7", env["REMOTE_ADDR"]
    conn, client = connect(proxy: true)
    assert_equal Request::DROP, advance(conn, client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "no header: not served"
  end

  def test_a_body_slower_than_min_body_rate_after_the_grace_is_too_slow
    start(min_body_rate: 1024)
    conn, client = connect
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_equal Request::BODY, advance(conn, client, "#{post(100_000)}hello")
    refute @request.too_slow?(conn, t + Request::MIN_RATE_GRACE + 1), "only a connection in BODY state is judged"
    conn.enter(Native::Conn::BODY, 30) # (Connections does this on BODY)
    refute @request.too_slow?(conn, t + Request::MIN_RATE_GRACE - 1), "within the grace"
    assert @request.too_slow?(conn, t + Request::MIN_RATE_GRACE + 1), "5 bytes in 11 s"
    other, = connect
    other.enter(Native::Conn::BODY, 30)
    refute @request.too_slow?(other, t + 100), "a connection reading no body"
  end

  def test_a_discarded_request_throws_its_spilled_body_away
    start(body_buffer: 16)
    conn, client = connect
    before = spill_files
    assert_equal Request::BODY, advance(conn, client, "#{post(1000)}#{'x' * 100}")
    assert_equal before + 1, spill_files
    @request.discard(conn)
    assert_equal before, spill_files, "the tempfile is closed"
    @request.discard(conn) # twice, or for a connection reading no body: nothing to do
  end

  def test_no_room_for_a_tempfile_is_a_503_and_logged
    start(body_buffer: 16)
    conn, client = connect
    full = ->(*) { raise Errno::ENOSPC }
    assert_equal 503, Tempfile.stub(:new, full) { advance(conn, client, "#{post(100)}#{'x' * 100}") }
    assert_equal ["cannot buffer a request body: No space left on device"], @logger.errors
  end

  def test_a_disk_filling_up_while_a_body_spills_is_a_503_and_logged
    start(body_buffer: 16)
    conn, client = connect
    head = "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert_equal Request::BODY, advance(conn, client, "#{head}a\r\n0123456789\r\n")
    full = ->(*) { raise Errno::ENOSPC }
    assert_equal 503, Tempfile.stub(:new, full) { advance(conn, client, "a\r\nabcdefghij\r\n", body: true) }
    assert_equal ["cannot buffer a request body: No space left on device"], @logger.errors
  end
end
