# frozen_string_literal: true

require_relative "../test_helper"

# Closing in stages (RFC 9112 9.6): when the server ends a connection while the client has
# sent more than it will answer, the kernel must not reset it, or the client loses responses it
# has not read yet. Every close path: the keep-alive request cap, a request asking to close with
# more pipelined behind it, an error answer to a body still arriving.
class StagedCloseTest < ServerTest
  BURST = 1000
  CAP = 100

  def setup
    @server = start_both(["--max-keepalive-requests", CAP.to_s], app: "kitchen.ru")
  end

  # Reads responses until the server closes; returns [responses, how it ended].
  def read_until_close(io, timeout: 20)
    data = +"".b
    ending = Timeout.timeout(timeout) do
      loop { data << io.readpartial(1 << 16) }
    rescue EOFError
      :eof
    rescue Errno::ECONNRESET
      :reset
    end
    [data.scan(%r{HTTP/1\.1 200 OK\r\n.*?\r\n\r\nhello world\n}m).size, ending]
  end

  def burst(io, n, last_close: false)
    reqs = Array.new(n) { |i| "GET /hello HTTP/1.1\r\nHost: x\r\n#{"Connection: close\r\n" if last_close && i.zero?}\r\n" }
    # the first request asks to close when last_close: everything behind it goes unanswered
    Thread.new do
      io.write(reqs.join)
    rescue SystemCallError, IOError
      nil
    end
  end

  %i[tcp unix].each do |transport|
    define_method("test_pipelined_burst_past_the_keepalive_cap_gets_every_answer_#{transport}") do
      io = @server.public_send(transport)
      writer = burst(io, BURST)
      answered, ending = read_until_close(io)
      writer.join(5)
      assert_equal CAP, answered, "every response the server sent arrives"
      assert_equal :eof, ending, "the connection ends with a FIN, not a reset"
    ensure
      io&.close
    end
  end

  def test_connection_close_with_more_requests_pipelined_behind_it
    io = @server.tcp
    writer = burst(io, BURST, last_close: true)
    answered, ending = read_until_close(io)
    writer.join(5)
    assert_equal 1, answered
    assert_equal :eof, ending
  ensure
    io&.close
  end

  # 413 at the head (the declared length is over --max-body) while the body keeps arriving.
  def test_error_answer_to_a_body_still_arriving_is_read_whole
    server = start_server(["-l", "127.0.0.1:0", "--max-body", "1000"], app: "kitchen.ru")
    io = server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n")
    writer = Thread.new do
      chunk = "x" * 65_536
      64.times { io.write(chunk) }
    rescue SystemCallError, IOError
      nil
    end
    writer.join(5) # the server's receive queue holds unread body bytes when it closes
    res = read_response(io)
    assert_equal 413, res&.status, "the answer arrives whole despite the unread body"
    assert closed_by_peer?(io)
  ensure
    writer&.kill
    io&.close
  end
end
