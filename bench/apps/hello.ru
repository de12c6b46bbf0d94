# frozen_string_literal: true
# The seed app: no Content-Length, so an HTTP/1.1 server must chunk it (or close after it).
require_relative "lib/bench_stats"
BenchStats.wrap(self)
run lambda { |_env| [200, {}, ["hello world\n"]] }
