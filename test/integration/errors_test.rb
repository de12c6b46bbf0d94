# frozen_string_literal: true

require_relative "../test_helper"

# Every rejection is a complete response with Connection: close; the connection is closed,
# a request pipelined behind the bad one is never answered, and the worker serves the next
# client.
class ErrorStatusTest < ServerTest
  FOLLOW = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"

  CASES = {
    "malformed request line" => ["GET /\r\n\r\n", 400],
    "space in target" => ["GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", 400],
    "control character in target" => ["GET /a\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 400],
    "invalid method character" => ["G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400],
    "HTTP/1.1 without Host" => ["GET / HTTP/1.1\r\n\r\n", 400],
    "two Host headers" => ["GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400],
    "obs-fold" => ["GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  continued\r\n\r\n", 400],
    "whitespace before colon" => ["GET / HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n", 400],
    "NUL in a field value" => ["GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400],
    "bare CR in a field value" => ["GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400],
    "Content-Length and Transfer-Encoding" =>
      ["POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400],
    "duplicate Content-Length" => ["POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nab", 400],
    "Content-Length list" => ["POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 1\r\n\r\na", 400],
    "signed Content-Length" => ["POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\na", 400],
    "hex Content-Length" => ["POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x1\r\n\r\na", 400],
    "overflowing Content-Length" => ["POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400],
    "repeated Transfer-Encoding" =>
      ["POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400],
    "unknown transfer coding" => ["POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501],
    # RFC 9112 6.3: chunked present but not final -> the length cannot be known -> 400 (MUST)
    "final coding not chunked" => ["POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400],
    "coding list without chunked" => ["POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, deflate\r\n\r\n", 501],
    "HTTP/2.0 in a request line" => ["GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505],
    "HTTP/0.9 version" => ["GET / HTTP/0.9\r\nHost: x\r\n\r\n", 505],
    # RFC 9110 2.5: HTTP/1.2 is read as HTTP/1.1 (not 505), so 1.1's rules hold: Host is required
    "HTTP/1.2 without Host" => ["GET / HTTP/1.2\r\n\r\n", 400],
    "invalid Host port" => ["GET / HTTP/1.1\r\nHost: x:abc\r\n\r\n", 400],
    "chunk size junk" => ["POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400],
    "chunk size overflow" =>
      ["POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\n", 400],
    "missing CRLF after chunk data" =>
      ["POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n", 400]
  }.freeze

  def setup
    @server = start_both(["--max-uri", "1024", "--max-headers", "20", "--max-header-bytes", "8192",
                          "--max-body", "1000"], app: "kitchen.ru")
  end

  CASES.each do |name, (data, status)|
    define_method("test_#{name.tr(' ', '_').gsub(/\W/, '')}") { assert_rejected(data, status) }
  end

  def test_uri_too_long_414
    assert_rejected("GET /#{'a' * 2000} HTTP/1.1\r\nHost: x\r\n\r\n", 414)
  end

  def test_too_many_headers_431
    assert_rejected("GET / HTTP/1.1\r\nHost: x\r\n#{(1..30).map { |i| "X-#{i}: v\r\n" }.join}\r\n", 431)
  end

  def test_header_section_too_large_431
    assert_rejected("GET / HTTP/1.1\r\nHost: x\r\nX-Big: #{'b' * 9000}\r\n\r\n", 431)
  end

  def test_body_too_large_413_by_content_length
    assert_rejected("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413)
  end

  def test_body_too_large_413_when_chunked
    chunks = "3e8\r\n#{'a' * 1000}\r\n3e8\r\n#{'a' * 1000}\r\n0\r\n\r\n"
    assert_rejected("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n#{chunks}", 413)
  end

  def test_expect_100_continue_with_too_large_body_gets_413_not_100
    io = @server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    res = read_response(io)
    assert_equal 413, res.status
  ensure
    io&.close
  end

  def test_worker_survives_and_unix_socket_too
    assert_rejected("BAD\r\n\r\n", 400, transport: :unix)
    io = @server.unix
    assert_equal 200, request(io, "GET", "/hello").status
  ensure
    io&.close
  end

  def test_app_exception_is_500_and_logged_with_backtrace
    io = @server.tcp
    res = request(io, "GET", "/raise")
    assert_equal 500, res.status
    assert_equal "close", res["connection"]
    assert_logged(@server, %r{app error: GET /raise: RuntimeError: boom from the app\n\s+.*kitchen\.ru:\d+})
    io2 = @server.tcp
    assert_equal 200, request(io2, "GET", "/hello").status
  ensure
    io&.close
    io2&.close
  end

  # Once a streamed body's head and first chunk are out, a failure cannot become a 500: the
  # connection ends without the last chunk, so the client sees a truncated body, and no second
  # status line is spliced into the stream.
  def test_body_failing_mid_stream_truncates_the_response_instead_of_splicing_a_500
    out = raw(@server, "GET /each-raise HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    head, body = out.split("\r\n\r\n", 2)
    assert_match(%r{\AHTTP/1\.1 200 }, head)
    assert_match(/transfer-encoding: chunked/i, head)
    assert_equal "5\r\nfirst\r\n", body, "the first chunk, then EOF: no final 0-chunk, no 500, nothing pipelined answered"
    assert_logged(@server, %r{body failed after the head was sent, connection closed: GET /each-raise: RuntimeError: boom in the middle})
    io = @server.tcp
    assert_equal 200, request(io, "GET", "/hello").status, "the worker serves the next client"
  ensure
    io&.close
  end

  def test_invalid_triplet_and_non_string_body_part_are_500
    %w[/bad-triplet /bad-part].each do |path|
      io = @server.tcp
      assert_equal 500, request(io, "GET", path).status, path
      io.close
    end
    assert_logged(@server, %r{invalid response: GET /bad-triplet: TypeError})
  end

  private

  def assert_rejected(data, status, transport: :tcp)
    out = raw(@server, data + FOLLOW, transport: transport)
    assert_one_closing_answer(out, status, data.inspect)
    io = @server.tcp
    assert_equal 200, request(io, "GET", "/hello").status, "the worker serves the next client"
  ensure
    io&.close
  end
end

# 408: a client too slow to send its head or its body; it never holds the worker meanwhile.
class SlowClientTest < ServerTest
  # [a connection whose head never ends, one whose body stops short], both sent.
  def slow_clients(server)
    slow_head = server.tcp
    slow_head.write("GET /hello HTTP/1.1\r\nHost: x\r\n") # never finishes
    short_body = server.tcp
    short_body.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly-ten!!") # Rhebok wedged here
    [slow_head, short_body]
  end

  # With deadlines far away (600 s), a fresh request is answered while both are still open: a
  # server that waited on either would not answer before its deadline.
  def test_a_slow_head_or_short_body_never_wedges_the_worker
    server = start_server(["-l", "127.0.0.1:0", "--header-timeout", "600", "--body-timeout", "600"], app: "kitchen.ru")
    slow = slow_clients(server)
    io = server.tcp
    assert_equal 200, request(io, "GET", "/hello").status
    slow.each { |s| assert_nil s.wait_readable(0), "still waiting for its deadline" }
  ensure
    [*slow, io].each { |s| s&.close }
  end

  def test_head_and_body_deadlines_answer_408
    server = start_server(["-l", "127.0.0.1:0", "--header-timeout", "1", "--body-timeout", "1"], app: "kitchen.ru")
    slow = slow_clients(server)
    slow.each do |s|
      res = read_response(s, timeout: 30)
      assert_equal 408, res.status
      assert closed_by_peer?(s)
    end
  ensure
    slow&.each(&:close)
  end

  def test_idle_keepalive_connection_is_closed_quietly_after_keepalive_timeout
    server = start_server(["-l", "127.0.0.1:0", "--keepalive-timeout", "1"], app: "kitchen.ru")
    io = server.tcp
    assert_equal 200, request(io, "GET", "/hello").status
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    Timeout.timeout(15) { assert_raises(EOFError) { io.readpartial(100) } } # no 408 for an idle connection
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - t, :>=, 0.5
  ensure
    io&.close
  end
end
