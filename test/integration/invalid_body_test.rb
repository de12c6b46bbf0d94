# frozen_string_literal: true

require "test_helper"

# Issue 22: a body that is not a Rack body (a String, nil, none at all: `[200, {}, "hello"]` is a
# common mistake) went out as a 200 with a chunked head and no body, cut short; so did an `each`
# body that raised before its first part. Like a bad status or header, each is a 500 now (complete,
# "Connection: close"), and the log names the problem. A body that fails after bytes went out still
# ends the connection (errors_test.rb: the response is truncated, never spliced with a 500).
module InvalidBodyCases
  FOLLOW = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" # pipelined behind: never answered after a 500

  {
    "/string" => /app returned a String body; a Rack body responds to each or call: GET \/string/,
    "/nil" => /app returned a nil body; a Rack body responds to each or call: GET \/nil/,
    # issue 32, item 13: what came back is named, not "a nil body"; so are a bad status and the request
    "/missing" => %r{app returned an Array of 2, not \[status, headers, body\]: GET /missing},
    "/status-word" => %r{app returned status "OK"; a Rack status is an integer 100\.\.999: GET /status-word},
    "/status-1000" => %r{app returned status 1000; a Rack status is an integer 100\.\.999: GET /status-1000},
    "/each-raise-first" => %r{body failed before its first part: GET /each-raise-first: RuntimeError: boom before the first part}
  }.each do |path, logged|
    define_method("test_#{path.delete_prefix('/').tr('-', '_')}_body_is_a_500") do
      out = raw(@server, "GET #{path} HTTP/1.1\r\nHost: x\r\n\r\n#{FOLLOW}")
      head = assert_one_closing_answer(out, 500, path)
      refute_match(/transfer-encoding/i, head)
      assert_logged(@server, logged)
      io = @server.tcp
      assert_equal 200, request(io, "GET", "/hello").status, "the worker serves the next client"
    ensure
      io&.close
    end
  end

  # The head of an `each` body now goes out with its first part: one that yields nothing is still a
  # complete, empty 200, and the connection is kept.
  def test_each_body_yielding_nothing_is_an_empty_200
    io = @server.tcp
    res = request(io, "GET", "/each-empty")
    assert_equal 200, res.status
    assert_equal "", res.body
    assert_equal 200, request(io, "GET", "/hello").status, "kept alive"
  ensure
    io&.close
  end

  # The request timeout fires while an `each` body works toward its first part: nothing was sent,
  # so the client gets the timeout's 503 (not an EOF).
  def test_a_timeout_before_the_first_part_is_a_503
    server = start_server(["-l", "127.0.0.1:0", "-t", "1", *self.class::ARGS], app: "invalid_body.ru")
    out = raw(server, "GET /each-slow-first HTTP/1.1\r\nHost: x\r\n\r\n", timeout: 30)
    assert_match(%r{\AHTTP/1\.1 503 }, out, "got #{out[0, 120].inspect}")
    assert_logged(server, /request timeout \(1s\) before the body's first part: GET \/each-slow-first/)
  end

  # A HEAD request never iterates the body (nothing of it is sent), but an invalid one is still a 500.
  def test_head_of_an_invalid_body_is_a_500
    io = @server.tcp
    assert_equal 500, request(io, "HEAD", "/string").status
    io.close
    io = @server.tcp
    assert_equal 200, request(io, "HEAD", "/each-raise-first").status, "HEAD does not call each"
  ensure
    io&.close
  end
end

# One app thread (or BLACKBUCK_TEST_THREADS under rake test:threads).
class InvalidBodyTest < ServerTest
  include InvalidBodyCases
  ARGS = [].freeze

  def setup
    @server = start_server(["-l", "127.0.0.1:0", *ARGS], app: "invalid_body.ru")
  end
end

# The app on two threads: the same answers from an app thread.
class InvalidBodyThreadsTest < ServerTest
  include InvalidBodyCases
  ARGS = %w[--threads 2].freeze

  def setup
    @server = start_server(["-l", "127.0.0.1:0", *ARGS], app: "invalid_body.ru")
  end
end
