# frozen_string_literal: true

# The bundled demo: `bundle exec blackbuck demo/config.ru`, then open http://localhost:9292/
require "json"

run lambda { |env|
  case env["PATH_INFO"]
  when "/"
    [200, { "content-type" => "text/plain" }, ["Hello from Blackbuck (pid #{Process.pid})\n"]]
  when "/env"
    info = env.select { |k, v| k.match?(/\A[A-Z_]+\z/) && v.is_a?(String) }
    [200, { "content-type" => "application/json" }, [JSON.pretty_generate(info), "\n"]]
  when "/stream"
    body = Enumerator.new { |y| 5.times { |i| y << "chunk #{i}\n" } }
    [200, { "content-type" => "text/plain" }, body]
  when "/echo"
    [200, { "content-type" => "application/octet-stream" }, [env["rack.input"].read]]
  else
    [404, { "content-type" => "text/plain" }, ["not found\n"]]
  end
}
