# frozen_string_literal: true

# For the recycling tests: every request with ?leak=KIB keeps that many KiB for good (a memory
# leak in the app); every answer names the worker's pid. /download?bytes=N for the fault suite's
# slow readers (download.rb).
require_relative "download"

LEAKED = []

run lambda { |env|
  if (download = Download.call(env))
    next download
  end

  kib = env["QUERY_STRING"].to_s[/leak=(\d+)/, 1]
  LEAKED << ("x" * (Integer(kib) * 1024)) if kib
  body = "pid=#{Process.pid}\n"
  [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
}
