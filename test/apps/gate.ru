# frozen_string_literal: true

# GET /gate?name=N runs until the test opens the gate: a file N in $BB_GATE_DIR (30 s at most), so a
# test holds a request in the app exactly as long as it needs to, without guessing a time.
# Anything else: 200 "hello".
def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

run lambda { |env|
  name = env["PATH_INFO"] == "/gate" && env["QUERY_STRING"][/name=(\w+)/, 1]
  next [200, { "content-type" => "text/plain" }, ["hello\n"]] unless name

  path = File.join(ENV.fetch("BB_GATE_DIR"), name)
  give_up = monotonic + 30
  sleep 0.01 until File.exist?(path) || monotonic > give_up
  [200, { "content-type" => "text/plain" }, ["gate #{name} #{File.exist?(path) ? 'opened' : 'timed out'}\n"]]
}
