# frozen_string_literal: true
# The streams workload's app (issue 35): GET /sse answers text/event-stream with an `each` body
# that writes EVENTS events INTERVAL_MS apart (a sleep between two: the stream waits, as an LLM's
# tokens or a Turbo Stream do); GET / answers hello world with Content-Length (the fast endpoint).
# The query string may set both (`/sse?events=5&interval_ms=100`): the workload's numbers live in
# the harness (workloads.rb), the defaults here are the issue's. No Content-Length on /sse: each
# server frames it its own way (chunked, or closed at the end: Unicorn, Pitchfork). Only `each`:
# the same body on Rack 2 and Rack 3.
EVENTS = 30
INTERVAL_MS = 100
MAX_EVENTS = 10_000 # a query string cannot make a stream longer than this
BODY = "hello world\n"
HELLO = { "content-type" => "text/plain", "content-length" => BODY.bytesize.to_s }.freeze
SSE = { "content-type" => "text/event-stream", "cache-control" => "no-cache", "x-accel-buffering" => "no" }.freeze

# One stream: event i is "id: i\ndata: event i\n\n"; the first goes out at once, then one each
# interval.
class EventStream
  def initialize(events, interval_s)
    @events = events
    @interval_s = interval_s
  end

  def each
    @events.times do |i|
      sleep @interval_s if i.positive?
      yield "id: #{i}\ndata: event #{i}\n\n"
    end
  end
end

require_relative "lib/bench_stats"
BenchStats.wrap(self)
run lambda { |env|
  next [200, HELLO.dup, [BODY]] unless env["PATH_INFO"] == "/sse"

  q = env["QUERY_STRING"].to_s.split("&").to_h { |kv| k, v = kv.split("=", 2); [k, v] }
  events = Integer(q.fetch("events", EVENTS), exception: false)&.clamp(1, MAX_EVENTS) || EVENTS
  interval_ms = Integer(q.fetch("interval_ms", INTERVAL_MS), exception: false)&.clamp(0, 60_000) || INTERVAL_MS
  [200, SSE.dup, EventStream.new(events, interval_ms / 1000.0)]
}
