# frozen_string_literal: true

# Hardening tests: answers every request with what the server parsed, one "KEY=value" per
# line, and the request body's size, so a test can see exactly what reached the app.
KEYS = %w[REQUEST_METHOD PATH_INFO QUERY_STRING REQUEST_URI SERVER_NAME SERVER_PORT SERVER_PROTOCOL
          CONTENT_LENGTH HTTP_HOST HTTP_X_FORWARDED_FOR].freeze

run lambda { |env|
  body = env["rack.input"].read
  lines = KEYS.map { |k| "#{k}=#{env[k]}" }
  lines << "BODY=#{body}" << "BODY_SIZE=#{body.bytesize}"
  [200, { "content-type" => "text/plain" }, [lines.join("\n") << "\n"]]
}
