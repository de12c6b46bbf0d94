# frozen_string_literal: true

# The fault suite's app: hello world, and /download?bytes=N for its slow readers (download.rb).
require_relative "download"

run lambda { |env| Download.call(env) || [200, { "content-type" => "text/plain" }, ["hello world\n"]] }
