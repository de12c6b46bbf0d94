# frozen_string_literal: true

require_relative "../test_helper"

# Keep-alive is decided in one place (Conn#next_request and the head's Connection header, in C):
# the client's wish, the response's framing, max_keepalive_requests, --no-keepalive and the
# worker's stop. Each ends the connection after a response that says "Connection: close".
class KeepalivePolicyTest < ServerTest
  %i[tcp unix].each do |transport|
    define_method("test_max_keepalive_requests_ends_the_connection_on_the_last_one_over_#{transport}") do
      server = start_both(["--max-keepalive-requests", "3"], app: "kitchen.ru")
      io = server.public_send(transport)
      2.times { |i| assert_nil request(io, "GET", "/hello?#{i}")["connection"], "request #{i + 1} of 3 keeps it" }
      last = request(io, "GET", "/hello?last")
      assert_equal 200, last.status
      assert_equal "close", last["connection"]
      assert closed_by_peer?(io), "the server closes after the third"
    ensure
      io&.close
    end
  end

  def test_no_keepalive_closes_after_every_response
    server = start_server(["--no-keepalive"], app: "kitchen.ru")
    2.times do
      io = server.tcp
      res = request(io, "GET", "/hello")
      assert_equal "hello world\n", res.body
      assert_equal "close", res["connection"]
      assert closed_by_peer?(io)
    ensure
      io&.close
    end
  end

  def test_a_stopping_worker_answers_an_idle_connection_with_connection_close
    server = start_server(["-w", "1"], app: "kitchen.ru")
    io = server.tcp
    assert_nil request(io, "GET", "/hello")["connection"]
    server.signal(:TERM)
    # the worker has begun its stop; it answers idle connections for STOP_IDLE_DRAIN
    wait_for(15, "the worker's stop") { server.log.match?(/worker 0 \(pid \d+\) stopping: /) }
    res = request(io, "GET", "/hello")
    assert_equal 200, res.status
    assert_equal "close", res["connection"]
    assert closed_by_peer?(io)
    assert server.wait_exit, "the server exits"
  ensure
    io&.close
  end
end
