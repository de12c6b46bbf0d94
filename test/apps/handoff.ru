# frozen_string_literal: true

# For the hand-off tests: GET /?sleep=SECONDS waits that long, GET /?gate=NAME until the test opens
# that gate (GateWait: a file in $BB_GATE_DIR); every answer names the worker that
# ran it, the client address it saw, the request's queue time and its id=... query parameter:
#   "pid=123 addr=127.0.0.1 queue=0.0012 id=3-14"
# BB_ID_LOG=FILE: each request's id is appended there, one line per run of the app.
require_relative "gate_wait"

ID_LOG = ENV.fetch("BB_ID_LOG", nil)

run lambda { |env|
  secs = env["QUERY_STRING"].to_s[/sleep=([\d.]+)/, 1]
  sleep(Float(secs)) if secs
  gate = env["QUERY_STRING"].to_s[/gate=(\w+)/, 1]
  GateWait.until_open(gate) if gate
  id = env["QUERY_STRING"].to_s[/id=([\w-]+)/, 1]
  File.write(ID_LOG, "#{id}\n", mode: "a") if ID_LOG && id
  body = "pid=#{Process.pid} addr=#{env['REMOTE_ADDR']} queue=#{env['blackbuck.queue_time'].round(4)} " \
         "id=#{id}\n"
  [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
}
