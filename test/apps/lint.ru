# frozen_string_literal: true

# The kitchen app's well-behaved routes behind Rack::Lint: any spec violation by the server
# (env, input, response handling) raises inside Lint and shows up as a 500.
require "rack"
require "rack/lint"

inner = lambda { |env|
  case env["PATH_INFO"]
  when "/echo"
    body = env["rack.input"].read
    [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
  when "/each"
    [200, { "content-type" => "text/plain" }, Enumerator.new { |y| y << "a"; y << "b" }]
  when "/head"
    [200, { "content-type" => "text/plain", "content-length" => "5" }, []]
  else
    [200, { "content-type" => "text/plain" }, ["lint ok\n"]]
  end
}
use Rack::Lint
run inner
