# frozen_string_literal: true
# An app that waits 10 ms per request, standing for a database call: the server's concurrency
# while the app waits (threads, or more connections per worker) is what this measures.
WAIT_S = 0.010
BODY = "hello world\n"
HEADERS = { "content-type" => "text/plain", "content-length" => BODY.bytesize.to_s }.freeze
require_relative "lib/bench_stats"
BenchStats.wrap(self)
run lambda { |_env|
  sleep WAIT_S
  [200, HEADERS.dup, [BODY]]
}
