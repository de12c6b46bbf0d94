# frozen_string_literal: true

require_relative "../test_helper"
require "digest"

# Request bodies: Content-Length and chunked (decoded in C), 100-continue, spilling to a
# tempfile, and bodies split across many reads.
class RequestBodyTest < ServerTest
  def setup
    @server = start_both(["--body-buffer", "4096"], app: "kitchen.ru")
  end

  def test_content_length_body
    io = @server.tcp
    res = request(io, "POST", "/echo", body: "hello body")
    assert_equal "hello body", res.body
    assert_equal "StringIO", res["x-input-class"]
    assert_equal 200, request(io, "POST", "/echo", body: "second").status, "keep-alive after a body"
  ensure
    io&.close
  end

  def test_chunked_body_is_decoded_and_gets_content_length
    io = @server.unix
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" \
             "5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n" \
             "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    res = read_response(io)
    assert_equal "hello world", res.body
    assert_equal "11", res["x-content-length"]
    assert_equal "hello world\n", read_response(io).body, "the pipelined request after a chunked body"
  ensure
    io&.close
  end

  def test_expect_100_continue
    io = @server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    interim = Timeout.timeout(15) { io.readpartial(100) }
    assert_equal "HTTP/1.1 100 Continue\r\n\r\n", interim
    io.write("data")
    res = read_response(io)
    assert_equal "data", res.body
  ensure
    io&.close
  end

  def test_large_body_is_spilled_to_a_tempfile_and_sent_in_pieces
    data = Random.new(42).bytes(300_000)
    io = @server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: #{data.bytesize}\r\n\r\n")
    data.bytes.each_slice(65_536) do |slice|
      io.write(slice.pack("C*"))
      sleep 0.02
    end
    res = read_response(io)
    assert_equal Digest::SHA256.hexdigest(data), res["x-sha256"]
    assert_equal "Tempfile", res["x-input-class"]
    assert_equal data.bytesize, res.body.bytesize
  ensure
    io&.close
  end

  def test_chunked_body_growing_past_the_buffer_spills
    part = "z" * 3000
    io = @server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    3.times { io.write("#{part.bytesize.to_s(16)}\r\n#{part}\r\n") }
    io.write("0\r\n\r\n")
    res = read_response(io)
    assert_equal 9000, res.body.bytesize
    assert_equal "Tempfile", res["x-input-class"]
  ensure
    io&.close
  end

  def test_body_sent_one_byte_at_a_time
    io = @server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    "3\r\nabc\r\n0\r\n\r\n".each_char do |c|
      io.write(c)
      sleep 0.005
    end
    assert_equal "abc", read_response(io).body
  ensure
    io&.close
  end
end
