# frozen_string_literal: true

require_relative "../test_helper"

# Response splitting: whatever an app puts in a header name or value, no CR or LF it supplied
# reaches the wire. Invalid headers make the answer a 500 with Connection: close (nothing of
# the app's head is written), and the worker serves on.
class ResponseInjectionTest < ServerTest
  APP = File.join(__dir__, "apps", "inject.ru")

  def setup
    @server = start_server(["-l", "127.0.0.1:0", "--early-hints"], app: APP)
  end

  %w[/value-crlf /value-bare-cr /value-nul /value-array-crlf /name-crlf /name-colon /name-space /name-empty
     /content-length-junk /status-1000].each do |path|
    define_method("test_refused_#{path.delete('/').tr('-', '_')}") do
      out = raw(@server, "GET #{path} HTTP/1.1\r\nHost: x\r\n\r\n")
      assert_match(%r{\AHTTP/1\.1 500 }, out, path)
      assert_match(/\r\nConnection: close\r\n/i, out)
      refute_match(/^Injected/i, out, "an injected header line reached the wire")
      refute_includes out, "body", "the app's body must not be sent"
      assert_match(/invalid response|app returned status/, @server.log) # (a status out of range names itself)
      io = @server.tcp
      assert_equal 200, request(io, "GET", "/fine").status
    ensure
      io&.close
    end
  end

  # rack.early_hints writes its own 103 head; a CR/LF in a value is refused (the app gets an
  # ArgumentError, the client a 500).
  def test_early_hints_value_with_crlf_is_refused
    out = raw(@server, "GET /early-value-crlf HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    refute_match(/^Injected/i, out)
    assert_match(%r{HTTP/1\.1 500 }, out)
  end

  def test_early_hints_name_with_crlf_is_refused
    out = raw(@server, "GET /early-name-crlf HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    refute_match(/^Injected/i, out, "rack.early_hints wrote a header name containing CRLF into the 103 response")
    assert_match(%r{HTTP/1\.1 500 }, out)
  end
end
