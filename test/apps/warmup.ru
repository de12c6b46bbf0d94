# frozen_string_literal: true

# For the warm-up tests: records each request the master makes through it before forking
# (the warmup directive), and builds a value the first time a request needs it, as a lazy cache
# would. GET /state (never a warm-up path) answers, in a worker, which paths the master requested and
# which process built the value: a worker forked after the warm-up inherited both. /fail answers
# 500, /raise raises, /missing answers 404.
MASTER = Process.pid # the process that loads config.ru: the master
WARMED = []          # paths requested while still in the master
CACHE = {}

run lambda { |env|
  path = env["PATH_INFO"]
  raise "cold database" if path == "/raise"

  WARMED << path if Process.pid == MASTER
  CACHE[:built_by] ||= Process.pid unless path == "/state"
  status = { "/fail" => 500, "/missing" => 404 }.fetch(path, 200)
  body = "warmed=#{WARMED.join(',')} built_by=#{CACHE[:built_by]} master=#{MASTER} pid=#{Process.pid}\n"
  [status, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
}
