# frozen_string_literal: true

# For the refork tests: what a worker builds lazily (here one string, standing for Rails' routes,
# views and caches) is built once per process that serves; a worker forked from the mold answers
# with the pid of the process that built it (the worker that forked the mold). REFORK_UNSAFE=1: the
# app says it cannot be forked again, so it is never reforked.
# REFORK_LOADED_LOG=FILE: each process that loads this file appends its pid there.
File.write(ENV["REFORK_LOADED_LOG"], "#{Process.pid}\n", mode: "a") if ENV["REFORK_LOADED_LOG"]
Blackbuck.no_longer_fork_safe!("the test app said so (REFORK_UNSAFE)") if ENV["REFORK_UNSAFE"] == "1"
WARM = {}

run lambda { |_env|
  WARM[:built_by] ||= Process.pid
  body = "pid=#{Process.pid} built_by=#{WARM[:built_by]}\n"
  [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
}
