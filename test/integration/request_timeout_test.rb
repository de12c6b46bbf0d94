# frozen_string_literal: true

require "test_helper"

# Issue 22: in development a request stopped at a `debugger` prompt was cut after 60 s (the default
# request timeout replaced the worker under the developer). Now development has no request timeout
# unless one is set (as Puma); elsewhere it stays 60 s. The boot log says which applies.
class RequestTimeoutTest < ServerTest
  DEVELOPMENT = { "RACK_ENV" => nil, "RAILS_ENV" => nil }.freeze # no -E and no env: development

  def test_development_has_no_request_timeout_unless_set
    server = start_server(["-l", "127.0.0.1:0"], app: "kitchen.ru", env: DEVELOPMENT)
    assert_logged(server, /Blackbuck \S+ \(development\)/)
    assert_logged(server, /request timeout: off \(the default in development; set timeout to have one\)/)
    io = server.tcp
    res = request(io, "GET", "/sleep?t=1.5") # past what -t 1 allows (below): not cut
    assert_equal 200, res.status
    assert_equal "slept\n", res.body
    refute_match(/timeout/, server.log.lines.grep_v(/request timeout: off/).join)
  ensure
    io&.close
  end

  # Given explicitly, in development too, the timeout applies: the request is answered 503.
  def test_development_with_timeout_given_applies_it
    server = start_server(["-l", "127.0.0.1:0", "-t", "1"], app: "kitchen.ru", env: DEVELOPMENT)
    assert_logged(server, /request timeout: 1s/)
    io = server.tcp
    assert_equal 503, request(io, "GET", "/sleep?t=5").status
    assert_logged(server, %r{request timeout \(1s\): GET /sleep: Blackbuck::RequestTimeout})
  ensure
    io&.close
  end

  # Outside development the default stays: 60 s (Config::REQUEST_TIMEOUT).
  def test_production_keeps_the_default
    server = start_server(["-l", "127.0.0.1:0", "-E", "production"], app: "kitchen.ru", env: DEVELOPMENT)
    assert_logged(server, /Blackbuck \S+ \(production\)/)
    assert_logged(server, /request timeout: 60s/)
  end
end
