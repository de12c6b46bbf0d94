# frozen_string_literal: true

require_relative "../test_helper"
require "json"

# Raw HTTP/1.x over real TCP and UNIX sockets against the real executable.
class HTTPTest < ServerTest
  def setup
    @server = start_both(["--early-hints"], app: "kitchen.ru")
  end

  %i[tcp unix].each do |transport|
    define_method("test_get_over_#{transport}") do
      io = @server.public_send(transport)
      res = request(io, "GET", "/hello")
      assert_equal 200, res.status
      assert_equal "hello world\n", res.body
      assert_equal "12", res["content-length"], "an Array body gets a Content-Length"
      assert_match(/\A\w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} GMT\z/, res["date"])
      assert_nil res["connection"], "HTTP/1.1 keep-alive is implicit"
    ensure
      io&.close
    end

    define_method("test_keepalive_and_pipelining_over_#{transport}") do
      io = @server.public_send(transport)
      3.times { |i| assert_equal "hello world\n", request(io, "GET", "/hello?#{i}").body }
      # three requests in one write: answered in order on the same connection
      io.write(%w[/hello /each /status?s=201].map { |p| "GET #{p} HTTP/1.1\r\nHost: x\r\n\r\n" }.join)
      assert_equal "hello world\n", read_response(io).body
      assert_equal "abbccc", read_response(io).body
      assert_equal 201, read_response(io).status
    ensure
      io&.close
    end
  end

  # More pipelined requests than a worker answers in a row (Worker::PIPELINE_BATCH, 16; the rest wait
  # their turn behind other connections): every one is answered, in order, on its connection, and so
  # is a request on another connection of the same worker.
  def test_a_long_pipeline_is_answered_in_order_across_turns
    server = start_server(["-l", "127.0.0.1:0", "-w", "1"], app: "kitchen.ru")
    piped = server.tcp
    other = server.tcp
    assert_equal 200, request(other, "GET", "/hello").status
    piped.write((1..40).map { |i| "GET /status?s=#{200 + i} HTTP/1.1\r\nHost: x\r\n\r\n" }.join)
    other.write("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 200, read_response(other).status
    assert_equal (201..240).to_a, Array.new(40) { read_response(piped).status }
    assert_equal 200, request(piped, "GET", "/hello").status, "the connection goes on after them"
  ensure
    piped&.close
    other&.close
  end

  def test_each_body_is_chunked_on_http11_and_close_delimited_on_http10
    io = @server.tcp
    res = request(io, "GET", "/each")
    assert_equal "chunked", res["transfer-encoding"]
    assert_nil res["content-length"]
    assert_equal "abbccc", res.body
    io.close

    io = @server.tcp
    res = request(io, "GET", "/each", version: "1.0")
    assert_nil res["transfer-encoding"]
    assert_equal "close", res["connection"]
    assert_equal "abbccc", res.body
    assert closed_by_peer?(io)
  ensure
    io&.close
  end

  # Rails 6.1's body defines to_ary returning nil: it must be streamed with each, not taken
  # for an empty Array (the head went out and the body never did).
  def test_body_whose_to_ary_answers_nil_is_streamed
    io = @server.tcp
    res = Timeout.timeout(15) { request(io, "GET", "/nil-to-ary") }
    assert_equal 302, res.status
    assert_equal "movedhere", res.body
    assert_equal 200, request(io, "GET", "/hello").status, "keep-alive after it"
  ensure
    io&.close
  end

  def test_app_content_length_is_passed_through_case_insensitively
    io = @server.tcp
    res = request(io, "GET", "/each-length")
    assert_equal "6", res["content-length"]
    assert_nil res["transfer-encoding"], "a Content-Length from the app (any case) means no chunking"
    assert_equal "abbccc", res.body
    assert_equal 1, res.raw.scan(/content-length/i).size
  ensure
    io&.close
  end

  def test_rack3_callable_body_is_streamed
    io = @server.tcp
    res = request(io, "GET", "/callable")
    assert_equal "streamed body", res.body
    assert_equal "chunked", res["transfer-encoding"]
    assert_equal 200, request(io, "GET", "/hello").status, "the connection stays usable"
  ensure
    io&.close
  end

  def test_http10_keepalive_is_honoured
    io = @server.tcp
    res = request(io, "GET", "/hello", version: "1.0", headers: { "Connection" => "keep-alive" })
    assert_equal "keep-alive", res["connection"]
    res = request(io, "GET", "/hello", version: "1.0", headers: { "Connection" => "keep-alive" })
    assert_equal 200, res.status
    res = request(io, "GET", "/hello", version: "1.0")
    assert_equal "close", res["connection"]
    assert closed_by_peer?(io)
  ensure
    io&.close
  end

  def test_connection_close_from_client_and_from_app
    io = @server.tcp
    res = request(io, "GET", "/hello", headers: { "Connection" => "close" })
    assert_equal "close", res["connection"]
    assert closed_by_peer?(io)
    io.close
    io = @server.tcp
    res = request(io, "GET", "/close-header")
    assert_equal "close", res["connection"]
    assert_equal "bye", res.body
    assert closed_by_peer?(io)
  ensure
    io&.close
  end

  def test_head_204_304_have_no_body
    io = @server.tcp
    res = request(io, "HEAD", "/hello")
    assert_equal 200, res.status
    assert_equal "", res.body
    # the connection is still in sync: a body would have been read as the next response
    [204, 304].each do |s|
      res = request(io, "GET", "/status?s=#{s}")
      assert_equal s, res.status
      assert_nil res["content-length"]
      assert_nil res["transfer-encoding"]
    end
    assert_equal "hello world\n", request(io, "GET", "/hello").body
  ensure
    io&.close
  end

  # HEAD gets the Content-Length its GET would have when the body is an Array (Rack 3 apps and
  # Rack::Lint-free stacks hand the GET body to HEAD); a streamed body or an empty one says nothing.
  def test_head_of_an_array_body_has_the_get_length
    io = @server.tcp
    res = request(io, "HEAD", "/hello")
    assert_equal ["12", ""], [res["content-length"], res.body]
    res = request(io, "HEAD", "/each-length")
    assert_equal "6", res["content-length"], "the app's own length stands"
    res = request(io, "HEAD", "/each")
    assert_nil res["content-length"]
    assert_nil res["transfer-encoding"]
    res = request(io, "HEAD", "/status?s=200")
    assert_nil res["content-length"], "an empty Array may be Rack::Head's: no length is better than a wrong one"
    assert_equal "hello world\n", request(io, "GET", "/hello").body, "still in sync"
  ensure
    io&.close
  end

  def test_array_body_larger_than_iov_max
    io = @server.unix
    n = 5000 # IOV_MAX is 1024 on Linux
    res = request(io, "GET", "/iovmax?n=#{n}")
    expected = Array.new(n) { |i| "#{i}," }.join
    assert_equal expected.bytesize, res["content-length"].to_i
    assert_equal expected, res.body
    assert_equal 200, request(io, "GET", "/hello").status
  ensure
    io&.close
  end

  def test_large_response_to_a_slow_reader_does_not_block_others
    slow = @server.tcp
    slow.write("GET /big?n=#{8 * 1024 * 1024} HTTP/1.1\r\nHost: x\r\n\r\n") # far more than socket buffers
    assert slow.wait_readable(30), "the response began" # and cannot have ended: the client reads nothing yet
    io = @server.tcp
    # answered while the slow reader's response is still being written (a server that waited for
    # the reader would never answer: it reads only after this)
    assert_equal 200, request(io, "GET", "/hello").status
    res = read_response(slow, timeout: 30)
    assert_equal 8 * 1024 * 1024, res.body.bytesize
  ensure
    io&.close
    slow&.close
  end

  def test_streamed_body_to_a_slow_reader_does_not_block_others
    slow = @server.tcp
    slow.write("GET /stream-big?n=#{768 * 1024} HTTP/1.1\r\nHost: x\r\n\r\n") # queued, not waited for
    assert slow.wait_readable(30), "the response began"
    io = @server.tcp
    assert_equal 200, request(io, "GET", "/hello").status # (the slow reader reads only after this)
    res = read_response(slow, timeout: 30)
    assert_equal "chunked", res["transfer-encoding"]
    assert_equal 768 * 1024, res.body.bytesize
    assert_equal 200, request(slow, "GET", "/hello").status, "the connection is still in sync"
  ensure
    io&.close
    slow&.close
  end

  # Regression (poll backend): the server closes a connection, the next one gets the same fd
  # number and, having sent nothing yet, must be registered for reading again.
  def test_a_closed_connection_slot_is_reused_cleanly
    5.times do |i|
      bad = @server.unix
      bad.write("BAD\r\n\r\n")
      bad.read
      bad.close
      io = @server.unix
      sleep 0.05 # nothing to read when it is accepted
      assert_equal 200, request(io, "GET", "/hello?#{i}").status
      io.close
    end
  end

  def test_env
    io = @server.tcp
    res = request(io, "GET", "/env?a=1&b=%20", headers: { "Host" => "example.com:8080", "X-Thing" => "v1",
                                                          "Cookie" => "a=1" })
    env = JSON.parse(res.body)
    assert_equal "GET", env["REQUEST_METHOD"]
    assert_equal "/env", env["PATH_INFO"]
    assert_equal "a=1&b=%20", env["QUERY_STRING"]
    assert_equal "example.com", env["SERVER_NAME"]
    assert_equal "8080", env["SERVER_PORT"]
    assert_equal "127.0.0.1", env["REMOTE_ADDR"]
    assert_equal "HTTP/1.1", env["SERVER_PROTOCOL"]
    assert_equal "v1", env["HTTP_X_THING"]
    assert_equal "http", env["rack.url_scheme"]
    assert_equal "", env["SCRIPT_NAME"]
    refute env.key?("HTTP_CONTENT_LENGTH")
  ensure
    io&.close
  end

  # A keep-alive connection's requests share what does not change between them (REMOTE_ADDR, the
  # protocol, the listener's entries: copied from one env to the next), and nothing else: headers,
  # query and callbacks are each request's own, and a request of another HTTP version gets its own.
  def test_each_request_on_a_keepalive_connection_has_its_own_env
    %i[tcp unix].each do |transport|
      io = @server.public_send(transport)
      answers = [request(io, "GET", "/env?one=1", headers: { "X-Thing" => "v1" })]
      io.write("GET /env HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
      answers << read_response(io)
      answers << request(io, "GET", "/env")
      # one connection: each answer came on io, and none of them ended it
      refute_includes answers, nil, "one connection: every answer came on it"
      assert_equal [nil, "keep-alive", nil], answers.map { |r| r["connection"] }, "one connection: kept open"
      first, old, second = answers.map { |r| JSON.parse(r.body) }
      assert_equal %w[HTTP/1.1 HTTP/1.0 HTTP/1.1], [first, old, second].map { |e| e["SERVER_PROTOCOL"] }
      assert_equal %w[HTTP/1.1 HTTP/1.0 HTTP/1.1], [first, old, second].map { |e| e["HTTP_VERSION"] }
      assert_equal %w[true false true], [first, old, second].map { |e| e["rack.early_hints?"] },
                   "103 Early Hints are offered to HTTP/1.1 requests only"
      assert_equal %w[0 0 0], [first, old, second].map { |e| e["rack.response_finished.size"] },
                   "no request sees the callbacks of the one before"
      assert_equal ["one=1", "", ""], [first, old, second].map { |e| e["QUERY_STRING"] }
      assert_equal ["v1", nil, nil], [first, old, second].map { |e| e["HTTP_X_THING"] }
      assert_equal [first["REMOTE_ADDR"]] * 2, [old, second].map { |e| e["REMOTE_ADDR"] }
    ensure
      io&.close
    end
  end

  # The Host entries a connection's first request made are reused only for the same Host: a client
  # that changes Host, sends an absolute-form target or X-Forwarded-Proto gets entries of its own.
  def test_host_entries_follow_each_request_on_a_keepalive_connection
    io = @server.tcp
    env = lambda do |target = "/env", headers = {}|
      JSON.parse(request(io, "GET", target, headers: headers).body).values_at("HTTP_HOST", "SERVER_NAME", "SERVER_PORT",
                                                                              "rack.url_scheme")
    end
    assert_equal ["a.example:8080", "a.example", "8080", "http"], env.call("/env", "Host" => "a.example:8080")
    assert_equal ["a.example:8080", "a.example", "8080", "http"], env.call("/env", "Host" => "a.example:8080")
    assert_equal ["b.example", "b.example", "80", "http"], env.call("/env", "Host" => "b.example")
    assert_equal ["a.example:8080", "a.example", "8080", "http"], env.call("/env", "Host" => "a.example:8080")
    assert_equal ["c.example:81", "c.example", "81", "http"], env.call("http://c.example:81/env", "Host" => "a.example:8080")
    io.close

    io = @server.tcp
    assert_equal ["a.example", "a.example", "80", "http"], env.call("/env", "Host" => "a.example")
    assert_equal ["a.example", "a.example", "443", "https"], env.call("/env", "Host" => "a.example", "X-Forwarded-Proto" => "https")
    assert_equal ["a.example", "a.example", "80", "http"], env.call("/env", "Host" => "a.example")
  ensure
    io&.close
  end

  # Bodiless requests share one empty rack.input; an app that closes it (Rack forbids it) does not
  # break the requests after it.
  def test_an_app_that_closes_an_empty_rack_input_breaks_no_later_request
    server = start_server(["-l", "127.0.0.1:0", "-w", "1"], app: "kitchen.ru")
    io = server.tcp
    assert_equal "closed", request(io, "GET", "/close-input").body
    2.times do
      res = request(io, "GET", "/echo")
      assert_equal [200, ""], [res.status, res.body], "the next request reads an open, empty input"
    end
    assert_equal "posted", request(io, "POST", "/echo", body: "posted").body
  ensure
    io&.close
  end

  # Common field names and methods come from a table interned at load; any spelling of a name
  # maps to the same key, and names that are not in the table still work.
  def test_header_names_in_any_case_and_methods_map_to_their_env_keys
    io = @server.tcp
    io.write("PATCH /env HTTP/1.1\r\nhOsT: x\r\nUSER-AGENT: ua\r\naccept: a\r\nAccept: b\r\n" \
             "x-forwarded-PROTO: https\r\nX-Forwarded-Fo: near\r\nX-Forwarded-Forx: far\r\n\r\n")
    env = JSON.parse(read_response(io).body)
    assert_equal "PATCH", env["REQUEST_METHOD"]
    assert_equal "x", env["HTTP_HOST"]
    assert_equal "ua", env["HTTP_USER_AGENT"]
    assert_equal "a, b", env["HTTP_ACCEPT"]
    assert_equal "https", env["HTTP_X_FORWARDED_PROTO"]
    assert_equal "near", env["HTTP_X_FORWARDED_FO"]
    assert_equal "far", env["HTTP_X_FORWARDED_FORX"]
    refute env.key?("HTTP_X_FORWARDED_FOR")
    io.write("BREW /env HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal "BREW", JSON.parse(read_response(io).body)["REQUEST_METHOD"]
  ensure
    io&.close
  end

  def test_repeated_headers_are_joined_and_underscored_names_dropped
    io = @server.tcp
    io.write("GET /env HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\nCookie: a=1\r\nCookie: b=2\r\n" \
             "X-Forwarded-For: 10.0.0.1\r\nX_Forwarded_For: 6.6.6.6\r\n\r\n")
    env = JSON.parse(read_response(io).body)
    assert_equal "1, 2", env["HTTP_X_A"]
    assert_equal "a=1; b=2", env["HTTP_COOKIE"]
    assert_equal "10.0.0.1", env["HTTP_X_FORWARDED_FOR"], "X_Forwarded_For must not overwrite X-Forwarded-For"
  ensure
    io&.close
  end

  def test_response_headers_arrays_and_newlines_become_separate_lines
    io = @server.tcp
    res = request(io, "GET", "/headers")
    assert_equal 2, res.raw.scan(/^set-cookie: /).size
    assert_includes res.raw, "x-multi: one\r\nx-multi: two\r\n"
  ensure
    io&.close
  end

  def test_response_splitting_is_refused_with_500
    io = @server.tcp
    res = request(io, "GET", "/bad-header")
    assert_equal 500, res.status
    refute_includes res.raw, "Injected"
  ensure
    io&.close
  end

  def test_host_without_port_uses_default_port
    io = @server.tcp
    env = JSON.parse(request(io, "GET", "/env", headers: { "Host" => "example.com" }).body)
    assert_equal "80", env["SERVER_PORT"]
    io.close
    io = @server.tcp
    io.write("GET /env HTTP/1.0\r\n\r\n") # HTTP/1.0 may omit Host: the listener's address stands in
    env = JSON.parse(read_response(io).body)
    assert_equal "127.0.0.1", env["SERVER_NAME"]
    assert_equal @server.tcp_port.to_s, env["SERVER_PORT"]
  ensure
    io&.close
  end

  # Off by default (nginx before 1.29 and many proxies cannot pass a 1xx on: Rails' asset tags would
  # hang every HTML page behind them): no rack.early_hints in the env, on either protocol version.
  def test_no_early_hints_unless_asked_for
    server = start_server(["-l", "127.0.0.1:0"], app: "kitchen.ru")
    io = server.tcp
    assert_equal "false", JSON.parse(request(io, "GET", "/env").body)["rack.early_hints?"]
    threaded = start_server(["-l", "127.0.0.1:0", "--threads", "2"], app: "kitchen.ru")
    io2 = threaded.tcp
    assert_equal "false", JSON.parse(request(io2, "GET", "/env").body)["rack.early_hints?"], "with app threads"
  ensure
    io&.close
    io2&.close
  end

  def test_early_hints_103_before_the_response
    io = @server.tcp
    io.write("GET /early HTTP/1.1\r\nHost: x\r\n\r\n")
    hints = read_response(io)
    assert_equal 103, hints.status
    assert_equal 2, hints.raw.scan(/^link: <\/[ab]\.\w+>; rel=preload/).size
    final = read_response(io)
    assert_equal 200, final.status
    assert_equal "after hints", final.body
  ensure
    io&.close
  end

  def test_absolute_form_target_authority_wins_over_host
    io = @server.tcp
    io.write("GET http://example.org:8443/env?q=1 HTTP/1.1\r\nHost: other.test\r\n\r\n")
    env = JSON.parse(read_response(io).body)
    assert_equal "/env", env["PATH_INFO"]
    assert_equal "q=1", env["QUERY_STRING"]
    assert_equal "example.org", env["SERVER_NAME"]
    assert_equal "8443", env["SERVER_PORT"]
    io.write("GET http://example.org/env HTTP/1.1\r\nHost: other.test\r\n\r\n")
    env = JSON.parse(read_response(io).body)
    assert_equal "example.org", env["SERVER_NAME"]
    assert_equal "80", env["SERVER_PORT"]
  ensure
    io&.close
  end

  # RFC 9112 3.2.2: the Host field is ignored, and Rack/Rails read the host from HTTP_HOST, so
  # HTTP_HOST must name the target's authority too (as in Unicorn), not what Host said.
  def test_absolute_form_target_authority_is_also_http_host
    io = @server.tcp
    io.write("GET http://a.example:8443/env?q=1 HTTP/1.1\r\nHost: b.example\r\n\r\n")
    env = JSON.parse(read_response(io).body)
    assert_equal "a.example:8443", env["HTTP_HOST"]
    assert_equal "a.example", env["SERVER_NAME"]
    assert_equal "8443", env["SERVER_PORT"]
    assert_equal "http://a.example:8443/env?q=1", env["REQUEST_URI"]
    io.write("GET HTTP://[::1]/env HTTP/1.0\r\n\r\n") # HTTP/1.0 needs no Host: the target gives it
    env = JSON.parse(read_response(io).body)
    assert_equal "[::1]", env["HTTP_HOST"]
    assert_equal "[::1]", env["SERVER_NAME"]
    assert_equal "80", env["SERVER_PORT"]
  ensure
    io&.close
  end

  def test_host_value_is_split_into_server_name_and_port
    { "[::1]:8080" => ["[::1]", "8080"], "[2001:db8::1]" => ["[2001:db8::1]", "80"],
      "127.0.0.1:0081" => ["127.0.0.1", "81"], "Example.COM." => ["Example.COM.", "80"] }.each do |host, (name, port)|
      io = @server.tcp
      env = JSON.parse(request(io, "GET", "/env", headers: { "Host" => host }).body)
      assert_equal [host, name, port], env.values_at("HTTP_HOST", "SERVER_NAME", "SERVER_PORT"), host
    ensure
      io&.close
    end
  end

  # A fragment is never sent by a conforming client (RFC 9112 3.2); when one is, it is cut off
  # everywhere: PATH_INFO, QUERY_STRING and REQUEST_URI.
  def test_fragment_is_dropped_from_path_query_and_request_uri
    io = @server.tcp
    { "/env#frag" => ["/env", "", "/env"], "/env?a=1#frag?b=2" => ["/env", "a=1", "/env?a=1"],
      "/env?#frag" => ["/env", "", "/env?"], "/env#f?a=1" => ["/env", "", "/env"],
      "http://h.example/env?a#f" => ["/env", "a", "http://h.example/env?a"] }.each do |target, want|
      io.write("GET #{target} HTTP/1.1\r\nHost: x\r\n\r\n")
      res = read_response(io)
      assert_equal 200, res.status, target
      env = JSON.parse(res.body)
      assert_equal want, env.values_at("PATH_INFO", "QUERY_STRING", "REQUEST_URI"), target
    end
  ensure
    io&.close
  end

  # RFC 9110 2.5: HTTP/1.2 (and any 1.x above 1.1) is answered as HTTP/1.1, with 1.1's rules:
  # keep-alive by default, chunked streaming, Host required.
  def test_http_1_minor_above_1_is_served_as_http_1_1
    io = @server.tcp
    io.write("GET /env HTTP/1.2\r\nHost: x\r\n\r\n")
    res = read_response(io)
    assert_match %r{\AHTTP/1\.1 200 }, res.raw
    assert_nil res["connection"], "kept alive as in 1.1"
    env = JSON.parse(res.body)
    assert_equal "HTTP/1.1", env["SERVER_PROTOCOL"]
    io.write("GET /each HTTP/1.9\r\nHost: x\r\n\r\n")
    res = read_response(io)
    assert_equal "chunked", res["transfer-encoding"]
    assert_equal "abbccc", res.body
    io.write("GET /hello HTTP/1.2\r\n\r\n")
    assert_equal 400, read_response(io).status, "no Host: 400, as in 1.1"
    io.close
    assert_match %r{\AHTTP/1\.1 505 }, raw(@server, "GET /hello HTTP/2.0\r\nHost: x\r\n\r\n")
  ensure
    io&.close
  end

  def test_full_hijack
    io = @server.tcp
    res = request(io, "GET", "/hijack")
    assert_equal "hijacked", res.body
    assert closed_by_peer?(io)
    io2 = @server.tcp
    assert_equal 200, request(io2, "GET", "/hello").status, "the worker goes on after a hijack"
  ensure
    io&.close
    io2&.close
  end

  def test_idle_keepalive_connections_do_not_block_a_fresh_request
    idle = Array.new(60) { @server.tcp } # one worker; Unicorn/Rhebok would be stuck on the first
    idle.each_with_index { |s, i| request(s, "GET", "/hello?#{i}") } # now all are idle keep-alive
    partial = Array.new(20) { @server.unix.tap { |s| s.write("GET / HTTP/1.1\r\nHo") } } # mid-head
    io = @server.tcp
    # answered while all 80 stay open (a server that waited on any of them would answer only once
    # it gave up on them, one keep-alive timeout each)
    assert_equal 200, request(io, "GET", "/hello").status
    assert(idle.none? { |s| s.wait_readable(0) }, "the idle connections are still open")
  ensure
    io&.close
    idle&.each(&:close)
    partial&.each(&:close)
  end
end

class IPv6Test < ServerTest
  def test_ipv6_listener_and_remote_addr
    skip "no IPv6 loopback here" unless Socket.ip_address_list.any?(&:ipv6_loopback?)
    server = start_server(["-l", "[::1]:0"], app: "kitchen.ru")
    io = TCPSocket.new("::1", server.tcp_port)
    env = JSON.parse(request(io, "GET", "/env", headers: { "Host" => "[::1]:#{server.tcp_port}" }).body)
    assert_equal "::1", env["REMOTE_ADDR"]
    assert_equal "[::1]", env["SERVER_NAME"]
    assert_equal server.tcp_port.to_s, env["SERVER_PORT"]
  ensure
    io&.close
  end
end
