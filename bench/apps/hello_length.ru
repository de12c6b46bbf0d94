# frozen_string_literal: true
# The seed app with Content-Length: every server can keep the connection alive without chunking.
BODY = "hello world\n"
HEADERS = { "content-type" => "text/plain", "content-length" => BODY.bytesize.to_s }.freeze
require_relative "lib/bench_stats"
BenchStats.wrap(self)
run lambda { |_env| [200, HEADERS.dup, [BODY]] }
