# frozen_string_literal: true

# The fault soak's app (soak/faults.rb): every answer names the worker that gave it (x-worker-pid),
# so a request lost on a keep-alive connection can be traced to a worker the soak killed.
# /download?bytes=N for the slow readers (test/apps/download.rb), /echo for uploads, hello world else.
require_relative "../test/apps/download"

PID_HEADER = "x-worker-pid"

run lambda { |env|
  status, headers, body =
    if (download = Download.call(env)) then download
    elsif env["PATH_INFO"] == "/echo"
      n = env["rack.input"].read.bytesize
      [200, { "content-type" => "text/plain" }, ["#{n}\n"]]
    else [200, { "content-type" => "text/plain" }, ["hello world\n"]]
    end
  [status, headers.merge(PID_HEADER => Process.pid.to_s), body]
}
