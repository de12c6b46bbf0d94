# frozen_string_literal: true

# Logs each request to $stdout, as Rails does in production (test/slow/worker_exit_test.rb): when
# $stdout is a file, Ruby buffers it, and only an exiting worker's flush writes the last lines.
run lambda { |env|
  $stdout.write("app logged #{env['PATH_INFO']}\n")
  [200, { "content-type" => "text/plain" }, ["ok\n"]]
}
