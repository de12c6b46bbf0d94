# frozen_string_literal: true

# GET /gate?name=N runs until the test opens the gate: a file N in $BB_GATE_DIR (GateWait, 30 s at
# most), so a test holds a request in the app exactly as long as it needs to, without guessing a time.
# Anything else: 200 "hello".
require_relative "gate_wait"

run lambda { |env|
  name = env["PATH_INFO"] == "/gate" && env["QUERY_STRING"][/name=(\w+)/, 1]
  next [200, { "content-type" => "text/plain" }, ["hello\n"]] unless name

  opened = GateWait.until_open(name)
  [200, { "content-type" => "text/plain" }, ["gate #{name} #{opened ? 'opened' : 'timed out'}\n"]]
}
