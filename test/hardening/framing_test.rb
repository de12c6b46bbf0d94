# frozen_string_literal: true

require_relative "../test_helper"

# Strict message framing (RFC 9112), the cases test/integration/errors_test.rb does not
# cover. The expected statuses are those ext/blackbuck/bb_http.c intends: 400 for syntax
# and framing errors (including "chunked" not last, RFC 9112 6.3), 501 for a transfer
# coding other than "chunked", 505 for a major version other than 1, 414 past the request
# line limit. Every rejection must be a complete response with "Connection: close", then
# EOF, and the request pipelined behind it must never be answered.
class StrictFramingTest < ServerTest
  APP = File.join(__dir__, "apps", "echo_env.ru")
  FOLLOW = "GET /follow HTTP/1.1\r\nHost: x\r\n\r\n"
  H = "Host: x\r\n"

  REJECTED = {
    # Transfer-Encoding
    "TE chunked in HTTP/1.0" => ["POST / HTTP/1.0\r\n#{H}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400],
    "TE chunked and CL in HTTP/1.0" =>
      ["POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400],
    "TE xchunked" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 501],
    "TE chunkedx" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunkedx\r\n\r\n0\r\n\r\n", 501],
    "TE chunked with a parameter" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n", 501],
    "TE quoted chunked" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: \"chunked\"\r\n\r\n0\r\n\r\n", 501],
    "TE identity" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: identity\r\n\r\n", 501],
    "TE name with a space before the colon" =>
      ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400],
    "TE obs-folded onto the previous line" =>
      ["POST / HTTP/1.1\r\n#{H}X-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400],
    "TE value obs-folded" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", 400],
    "TE vertical tab before chunked" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding:\vchunked\r\n\r\n0\r\n\r\n", 400],
    "TE form feed after chunked" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\f\r\n\r\n0\r\n\r\n", 400],
    "TE list chunked, chunked" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400],
    "TE list with an empty element" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked,\r\n\r\n0\r\n\r\n", 400],
    "TE empty" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding:\r\n\r\n", 400],
    "TE twice, differing in case" =>
      ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\ntransfer-encoding: identity\r\n\r\n0\r\n\r\n", 400],
    "TE chunked then CL (CL.TE reversed order)" =>
      ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", 400],
    # Content-Length
    "CL with a space inside" => ["POST / HTTP/1.1\r\n#{H}Content-Length: 1 2\r\n\r\n#{'a' * 12}", 400],
    "CL empty" => ["POST / HTTP/1.1\r\n#{H}Content-Length:\r\n\r\n", 400],
    "CL negative" => ["POST / HTTP/1.1\r\n#{H}Content-Length: -1\r\n\r\n", 400],
    "CL decimal point" => ["POST / HTTP/1.1\r\n#{H}Content-Length: 1.0\r\n\r\na", 400],
    "CL twice, differing in case" => ["POST / HTTP/1.1\r\n#{H}Content-Length: 1\r\ncontent-length: 1\r\n\r\na", 400],
    # chunked bodies
    "chunk extension over 1024 bytes" =>
      ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n1;#{'e' * 1100}\r\nx\r\n0\r\n\r\n", 400],
    "chunk size with 0x prefix" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n0x1\r\nx\r\n0\r\n\r\n", 400],
    "negative chunk size" => ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n", 400],
    "chunk size line ending in bare LF" =>
      ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n1\nx\r\n0\r\n\r\n", 400],
    "chunk data longer than its size" =>
      ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n", 400],
    "obs-fold in a trailer" =>
      ["POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n folded\r\n\r\n", 400],
    # line endings and control characters in the head
    "bare LF line endings throughout" => ["GET / HTTP/1.1\nHost: x\n\n", 400],
    "bare LF after one field" => ["GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n", 400],
    "bare LF ending the head" => ["GET / HTTP/1.1\r\nHost: x\r\n\n", 400],
    "leading bare LF before the request line" => ["\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", 400],
    "bare CR ending the request line" => ["GET / HTTP/1.1\rHost: x\r\n\r\n", 400],
    "bare CR ending a field" => ["GET / HTTP/1.1\r\nHost: x\rX-A: 1\r\n\r\n", 400],
    "DEL in a header name" => ["GET / HTTP/1.1\r\n#{H}X-A\x7fB: 1\r\n\r\n", 400],
    "NUL in a header name" => ["GET / HTTP/1.1\r\n#{H}X-A\x00B: 1\r\n\r\n", 400],
    "DEL in a header value" => ["GET / HTTP/1.1\r\n#{H}X-A: a\x7fb\r\n\r\n", 400],
    "empty header name" => ["GET / HTTP/1.1\r\n#{H}: v\r\n\r\n", 400],
    "header line without a colon" => ["GET / HTTP/1.1\r\n#{H}X-A\r\n\r\n", 400],
    "non-token character in a header name" => ["GET / HTTP/1.1\r\n#{H}X(A): 1\r\n\r\n", 400],
    # request line
    "0x80 byte in the target" => ["GET /a\x80b HTTP/1.1\r\n#{H}\r\n", 400],
    "0xFF byte in the target" => ["GET /\xff HTTP/1.1\r\n#{H}\r\n", 400],
    "DEL in the target" => ["GET /a\x7f HTTP/1.1\r\n#{H}\r\n", 400],
    "tab in the target" => ["GET /a\tb HTTP/1.1\r\n#{H}\r\n", 400],
    "target not starting with a slash" => ["GET hello HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with userinfo" => ["GET http://user@example.com/ HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with an unknown scheme" => ["GET ftp://example.com/ HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with an empty host" => ["GET http:///a HTTP/1.1\r\n#{H}\r\n", 400],
    "asterisk-form with GET" => ["GET * HTTP/1.1\r\n#{H}\r\n", 400],
    "CONNECT in authority-form" => ["CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 400],
    "HTTP/0.9 request line" => ["GET /\r\n", 400],
    "lowercase http/1.1" => ["GET / http/1.1\r\n#{H}\r\n", 400],
    "HTTP/1.10" => ["GET / HTTP/1.10\r\n#{H}\r\n", 400],
    "HTTP/1 without minor" => ["GET / HTTP/1\r\n#{H}\r\n", 400],
    "HTTP/0.9 version" => ["GET / HTTP/0.9\r\n#{H}\r\n", 505],
    "HTTP/3.0" => ["GET / HTTP/3.0\r\n#{H}\r\n", 505],
    "HTTP/2.0" => ["GET / HTTP/2.0\r\n#{H}\r\n", 505],
    "HTTP/01.1" => ["GET / HTTP/01.1\r\n#{H}\r\n", 400],
    "HTTP/1.01" => ["GET / HTTP/1.01\r\n#{H}\r\n", 400],
    "HTTP/1.2 without Host, as 1.1" => ["GET / HTTP/1.2\r\n\r\n", 400],
    "a fragment alone as the target" => ["GET #x HTTP/1.1\r\n#{H}\r\n", 400],
    "two spaces after the method" => ["GET  / HTTP/1.1\r\n#{H}\r\n", 400],
    "tab between method and target" => ["GET\t/ HTTP/1.1\r\n#{H}\r\n", 400],
    "trailing space after the version" => ["GET / HTTP/1.1 \r\n#{H}\r\n", 400],
    "method over the request line limit" => ["#{'G' * 9000} / HTTP/1.1\r\n#{H}\r\n", 414],
    "empty method" => [" / HTTP/1.1\r\n#{H}\r\n", 400],
    # Host
    "Host with a space" => ["GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400],
    "Host with userinfo" => ["GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400],
    "Host with a slash" => ["GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400],
    "two Hosts differing only in case" => ["GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", 400],
    "two Hosts in HTTP/1.0" => ["GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400],
    # Host syntax (RFC 9110 7.2: uri-host [":" port]); Rack::Lint would reject each of these
    "Host with a non-numeric port" => ["GET / HTTP/1.1\r\nHost: foo:abc\r\n\r\n", 400],
    "Host with two ports" => ["GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n", 400],
    "Host with an empty port" => ["GET / HTTP/1.1\r\nHost: a:\r\n\r\n", 400],
    "Host with port 65536" => ["GET / HTTP/1.1\r\nHost: a:65536\r\n\r\n", 400],
    "Host with an 11-digit port" => ["GET / HTTP/1.1\r\nHost: a:99999999999\r\n\r\n", 400],
    "Host with a port only" => ["GET / HTTP/1.1\r\nHost: :80\r\n\r\n", 400],
    "Host IPv6 without the closing bracket" => ["GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400],
    "Host IPv6 with junk after the bracket" => ["GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", 400],
    "Host IPv6 with an empty port" => ["GET / HTTP/1.1\r\nHost: [::1]:\r\n\r\n", 400],
    "Host IPv6 with nine groups" => ["GET / HTTP/1.1\r\nHost: [1:2:3:4:5:6:7:8:9]\r\n\r\n", 400],
    "Host IPv6 with two ::" => ["GET / HTTP/1.1\r\nHost: [1::2::3]\r\n\r\n", 400],
    "Host IPv6 with a zone ID" => ["GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]\r\n\r\n", 400],
    "Host IPvFuture" => ["GET / HTTP/1.1\r\nHost: [v1.x]\r\n\r\n", 400],
    "Host with a bad percent-encoding" => ["GET / HTTP/1.1\r\nHost: a%zz\r\n\r\n", 400],
    "Host with a quote" => ["GET / HTTP/1.1\r\nHost: a\"b\r\n\r\n", 400],
    "Host with non-ASCII bytes" => ["GET / HTTP/1.1\r\nHost: caf\xC3\xA9\r\n\r\n", 400],
    "invalid Host beside an absolute-form target" => ["GET http://a/ HTTP/1.1\r\nHost: a:b\r\n\r\n", 400],
    "absolute-form with a non-numeric port" => ["GET http://a:abc/ HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with port 65536" => ["GET http://a:65536/ HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with an empty port" => ["GET http://a:/ HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with a port only" => ["GET http://:80/ HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with a broken IPv6 literal" => ["GET http://[::1/ HTTP/1.1\r\n#{H}\r\n", 400],
    "absolute-form with a zone ID" => ["GET http://[fe80::1%25eth0]/ HTTP/1.1\r\n#{H}\r\n", 400]
  }.freeze

  # One server for the whole class (each case is one connection; starting ~80 servers would
  # cost most of the suite's time budget). It is stopped by pid when the run ends.
  def self.shared_server
    @shared_server ||= begin
      dir = Dir.mktmpdir("bb-test")
      s = ServerProcess.new(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock"], app: APP, dir: dir)
      Minitest.after_run do
        s.stop
        FileUtils.rm_rf(dir)
      end
      s
    end
  end

  def setup
    @server = self.class.shared_server
    refute @server.exited?, "the shared server died:\n#{@server.log}"
  end

  def teardown
    super
    warn "\n--- server log (#{name}) ---\n#{@server.log}--- end ---" unless passed?
  end

  REJECTED.each do |name, (data, status)|
    define_method("test_rejects_#{name.downcase.gsub(/\W+/, '_')}") { assert_rejected(data, status) }
  end

  def test_rejections_on_the_unix_socket_too
    assert_rejected("POST / HTTP/1.0\r\n#{H}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, transport: :unix)
    assert_rejected("GET / HTTP/1.1\nHost: x\n\n", 400, transport: :unix)
  end

  # The same bad request split into one-byte writes gets the same answer: the parser's
  # decision must not depend on how the bytes arrive.
  def test_rejection_does_not_depend_on_segmentation
    io = @server.tcp
    "POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked, chunked\r\n\r\n".each_char do |c|
      io.write(c)
    rescue Errno::EPIPE, Errno::ECONNRESET
      break
    end
    res = read_response(io)
    assert_equal 400, res.status
    assert closed_by_peer?(io)
  ensure
    io&.close
  end

  # ---- accepted: the strict parser must not reject what RFC 9112 allows

  def test_absolute_form_is_accepted_and_split
    res = one("GET http://example.com:8080/a/b?x=1 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "PATH_INFO=/a/b\n"
    assert_includes res.body, "QUERY_STRING=x=1\n"
    assert_includes res.body, "REQUEST_URI=http://example.com:8080/a/b?x=1\n"
  end

  def test_absolute_form_without_path_means_slash
    res = one("GET HTTPS://example.com?q HTTP/1.1\r\nHost: example.com\r\n\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "PATH_INFO=/\n"
    assert_includes res.body, "QUERY_STRING=q\n"
  end

  # RFC 9112 3.2.2: the target's authority, not Host, in SERVER_NAME/PORT and HTTP_HOST alike.
  def test_absolute_form_authority_replaces_host
    { "GET http://a.example HTTP/1.1\r\nHost: b.example\r\n\r\n" => ["/", "", "a.example", "80"],
      "GET http://a.example?x=1 HTTP/1.1\r\nHost: b.example\r\n\r\n" => ["/", "x=1", "a.example", "80"],
      "GET http://a.example:81#f HTTP/1.1\r\nHost: b.example:82\r\n\r\n" => ["/", "", "a.example:81", "81"],
      "GET http://[::1]:8080/p HTTP/1.1\r\nHost:\r\n\r\n" => ["/p", "", "[::1]:8080", "8080"] }.each do |req, want|
      res = one(req)
      assert_equal 200, res.status, req.inspect
      path, query, host, port = want
      assert_includes res.body, "PATH_INFO=#{path}\nQUERY_STRING=#{query}\n", req.inspect
      assert_includes res.body, "SERVER_NAME=#{host.sub(/:\d+\z/, '')}\nSERVER_PORT=#{port}\n", req.inspect
      assert_includes res.body, "HTTP_HOST=#{host}\n", req.inspect
    end
  end

  def test_fragment_is_dropped
    res = one("GET /a?x=1#frag?y=2 HTTP/1.1\r\n#{H}\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "PATH_INFO=/a\nQUERY_STRING=x=1\nREQUEST_URI=/a?x=1\n"
    res = one("GET /a?#frag HTTP/1.1\r\n#{H}\r\n")
    assert_includes res.body, "PATH_INFO=/a\nQUERY_STRING=\nREQUEST_URI=/a?\n"
  end

  def test_http_1_2_is_answered_as_http_1_1
    res = one("GET / HTTP/1.2\r\n#{H}\r\n")
    assert_match %r{\AHTTP/1\.1 200 }, res.raw
    assert_includes res.body, "SERVER_PROTOCOL=HTTP/1.1\n"
  end

  # Valid Host shapes stay accepted, and the port is split off SERVER_NAME.
  def test_valid_host_forms_are_accepted
    { "example.com" => %w[example.com 80], "example.com:8080" => %w[example.com 8080],
      "127.0.0.1:80" => %w[127.0.0.1 80], "[::1]" => %w[[::1] 80], "[::1]:8080" => %w[[::1] 8080],
      "[::ffff:192.0.2.1]:443" => %w[[::ffff:192.0.2.1] 443], "a-b_c.~!$&'()*+,;=%41" => %w[a-b_c.~!$&'()*+,;=%41 80] }
      .each do |host, (name, port)|
      res = one("GET / HTTP/1.1\r\nHost: #{host}\r\n\r\n")
      assert_equal 200, res.status, host
      assert_includes res.body, "SERVER_NAME=#{name}\nSERVER_PORT=#{port}\n", host
      assert_includes res.body, "HTTP_HOST=#{host}\n", host
    end
  end

  def test_options_asterisk_is_accepted
    res = one("OPTIONS * HTTP/1.1\r\n#{H}\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "REQUEST_METHOD=OPTIONS\n"
    assert_includes res.body, "PATH_INFO=*\n"
  end

  def test_tab_and_space_around_chunked_and_any_case_are_accepted
    ["Transfer-Encoding:\tchunked", "Transfer-Encoding: chunked\t", "Transfer-Encoding: \t chunked \t",
     "transfer-encoding: CHUNKED"].each do |te|
      res = one("POST / HTTP/1.1\r\n#{H}#{te}\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
      assert_equal 200, res.status, te.inspect
      assert_includes res.body, "BODY=abc\n", te.inspect
    end
  end

  def test_content_length_with_surrounding_whitespace_is_accepted
    res = one("POST / HTTP/1.1\r\n#{H}Content-Length: \t3 \r\n\r\nabc")
    assert_equal 200, res.status
    assert_includes res.body, "BODY=abc\n"
  end

  def test_chunk_extension_up_to_the_limit_is_accepted
    ext = ";#{'e' * 1000}=\"v\\\"q\""
    res = one("POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n3#{ext}\r\nabc\r\n0\r\n\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "BODY=abc\n"
  end

  def test_leading_empty_lines_are_skipped
    res = one("\r\n\r\nGET /x HTTP/1.1\r\n#{H}\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "PATH_INFO=/x\n"
  end

  # bb_http.c accepts any visible ASCII byte (0x21-0x7E) in the target, as nginx does; the
  # app receives it verbatim. '<' and '"' are not valid URI characters (RFC 3986), so this
  # is a documented leniency, not a smuggling risk: framing does not depend on the target.
  def test_visible_ascii_outside_rfc3986_is_passed_through
    res = one("GET /a<b>\"c\"{}|\\^` HTTP/1.1\r\n#{H}\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "PATH_INFO=/a<b>\"c\"{}|\\^`\n"
  end

  def test_http10_without_host_is_accepted_and_closed
    res = one("GET /ten HTTP/1.0\r\n\r\n")
    assert_equal 200, res.status
    assert_includes res.body, "SERVER_PROTOCOL=HTTP/1.0\n"
  end

  # An underscore header is dropped so X_Forwarded_For cannot pose as X-Forwarded-For.
  def test_underscore_header_cannot_shadow_the_dashed_one
    res = one("GET / HTTP/1.1\r\n#{H}X_Forwarded_For: 6.6.6.6\r\n\r\n")
    assert_includes res.body, "HTTP_X_FORWARDED_FOR=\n"
    res = one("GET / HTTP/1.1\r\n#{H}X-Forwarded-For: 1.2.3.4\r\nX_Forwarded_For: 6.6.6.6\r\n\r\n")
    assert_includes res.body, "HTTP_X_FORWARDED_FOR=1.2.3.4\n"
  end

  # A request accepted after a body keeps the connection and serves the pipelined one.
  def test_pipelined_request_after_a_good_chunked_body_is_served
    io = @server.tcp
    io.write("POST / HTTP/1.1\r\n#{H}Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n#{FOLLOW}")
    assert_includes read_response(io).body, "BODY=abc\n"
    assert_includes read_response(io).body, "PATH_INFO=/follow\n"
  ensure
    io&.close
  end

  private

  # One request on a fresh connection; the response must not close it.
  def one(data)
    io = @server.tcp
    io.write(data)
    read_response(io)
  ensure
    io&.close
  end

  def assert_rejected(data, status, transport: :tcp)
    out = raw(@server, data + FOLLOW, transport: transport)
    assert_match(%r{\AHTTP/1\.1 #{status} }, out, "expected #{status} for #{data[0, 120].inspect}, got #{out[0, 80].inspect}")
    head, body = out.split("\r\n\r\n", 2)
    assert_match(/\r\nConnection: close(\r\n|\z)/i, head)
    assert_equal head[/Content-Length: (\d+)/i, 1].to_i, body.to_s.bytesize, "a complete response, then EOF"
    assert_equal 1, out.scan(%r{HTTP/1\.1 \d{3}}).size, "nothing after the bad request may be answered"
    refute_includes out, "PATH_INFO=", "the app must not have run"
    io = @server.tcp
    assert_equal 200, request(io, "GET", "/next").status, "the worker serves the next client"
  ensure
    io&.close
  end
end
