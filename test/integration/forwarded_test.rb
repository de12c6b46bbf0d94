# frozen_string_literal: true

require_relative "../test_helper"
require "json"

# Behind a TLS-terminating proxy (nginx, a load balancer): X-Forwarded-Proto: https (or
# X-Forwarded-Ssl: on, X-Forwarded-Scheme: https) makes rack.url_scheme "https" and the default
# SERVER_PORT 443, as with Puma and Unicorn; --no-trust-forwarded-proto turns that off.
class ForwardedProtoTest < ServerTest
  def env_for(server, headers)
    io = server.tcp
    res = request(io, "GET", "/env", headers: { "Host" => "example.com" }.merge(headers))
    assert_equal 200, res.status
    JSON.parse(res.body).values_at("rack.url_scheme", "SERVER_PORT")
  ensure
    io&.close
  end

  def test_forwarded_headers_set_the_scheme
    server = start_server(["-l", "127.0.0.1:0"], app: "kitchen.ru")
    {
      {} => %w[http 80],
      { "X-Forwarded-Proto" => "https" } => %w[https 443],
      { "x-forwarded-proto" => "HTTPS" } => %w[https 443],
      { "X-Forwarded-Proto" => "https, http" } => %w[https 443],
      { "X-Forwarded-Proto" => "http" } => %w[http 80],
      { "X-Forwarded-Proto" => "httpsx" } => %w[http 80],
      { "X-Forwarded-Ssl" => "on" } => %w[https 443],
      { "X-Forwarded-Ssl" => "off" } => %w[http 80],
      { "X-Forwarded-Scheme" => "https" } => %w[https 443],
      { "X-Forwarded-Proto" => "https", "Host" => "example.com:8443" } => %w[https 8443]
    }.each do |headers, want|
      assert_equal want, env_for(server, headers), headers.inspect
    end
  end

  def test_off_for_servers_facing_clients_directly
    server = start_server(["-l", "127.0.0.1:0", "--no-trust-forwarded-proto"], app: "kitchen.ru")
    assert_equal %w[http 80], env_for(server, { "X-Forwarded-Proto" => "https" })
    assert_equal %w[http 80], env_for(server, { "X-Forwarded-Ssl" => "on" })
  end

  def test_port_with_leading_zeros_is_its_number
    server = start_server(["-l", "127.0.0.1:0"], app: "kitchen.ru")
    assert_equal %w[http 80], env_for(server, { "Host" => "example.com:0080" })
  end
end
