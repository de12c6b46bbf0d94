# frozen_string_literal: true

# For the memory-recycling tests: the master builds SHARED_MIB MiB of strings at boot, before it
# forks, so every worker starts with them in its RSS but shares the pages (copy on write: nobody
# writes them again); they are no part of its USS. A request with ?leak=KIB keeps that many KiB for
# good (a leak: private pages). Every answer names the worker's pid.
SHARED_MIB = 64
SHARED = Array.new(SHARED_MIB) { |i| (i % 10).to_s * (1024 * 1024) }.freeze # written once: every page touched
LEAKED = []

run lambda { |env|
  kib = env["QUERY_STRING"].to_s[/leak=(\d+)/, 1]
  LEAKED << ("x" * (Integer(kib) * 1024)) if kib
  body = "pid=#{Process.pid}\n"
  [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
}
