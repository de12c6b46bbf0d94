# frozen_string_literal: true
# Mixed latencies: a fast endpoint (2 ms wait) and a slow one (300 ms wait), like an app whose
# few slow pages share workers with many fast ones. The mixed workload puts most clients on
# /fast and a few on /slow and reports each class's latency: what a slow request does to the
# fast ones queued behind it. Any other path answers at once (boot probe, warm-up).
WAITS_S = { "/fast" => 0.002, "/slow" => 0.300 }.freeze
BODY = "hello world\n"
HEADERS = { "content-type" => "text/plain", "content-length" => BODY.bytesize.to_s }.freeze
require_relative "lib/bench_stats"
BenchStats.wrap(self)
run lambda { |env|
  wait = WAITS_S[env["PATH_INFO"]]
  sleep wait if wait
  [200, HEADERS.dup, [BODY]]
}
