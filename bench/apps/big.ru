# frozen_string_literal: true
# A 64 KiB response (with Content-Length): measures the write path rather than request overhead.
SIZE = 64 * 1024
BODY = ("0123456789abcdef" * (SIZE / 16)).freeze
HEADERS = { "content-type" => "application/octet-stream", "content-length" => SIZE.to_s }.freeze
require_relative "lib/bench_stats"
BenchStats.wrap(self)
run lambda { |_env| [200, HEADERS.dup, [BODY]] }
