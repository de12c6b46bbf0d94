# frozen_string_literal: true

# The app of the rolling-deploy test: its "code version" is read from BB_VERSION_FILE when the
# app boots, as new code would be, so a restart or a HUP re-exec serves what the file then says.
VERSION_NOW = File.read(ENV.fetch("BB_VERSION_FILE")).strip
HOST = ENV.fetch("BB_HOST_NAME", "?")

run ->(_env) { [200, { "content-type" => "text/plain" }, ["#{VERSION_NOW} #{HOST}\n"]] }
