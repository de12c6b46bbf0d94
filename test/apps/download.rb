# frozen_string_literal: true

# GET /download?bytes=N for the fault suite's slow readers (test/faults/fault_helper.rb): N bytes,
# Content-Length given, made of one shared 1 MiB part so a download costs the app nothing.
module Download
  PART = ("d" * (1024 * 1024)).freeze
  MAX_BYTES = 64 * 1024 * 1024 # bytes one answer may ask for

  # The answer to env when it asks for a download, else nil.
  def self.call(env)
    return unless env["PATH_INFO"] == "/download"

    bytes = env["QUERY_STRING"].to_s[/bytes=(\d+)/, 1].to_i.clamp(0, MAX_BYTES)
    body = Array.new(bytes / PART.bytesize, PART)
    body << PART.byteslice(0, bytes % PART.bytesize) unless (bytes % PART.bytesize).zero?
    [200, { "content-type" => "application/octet-stream", "content-length" => bytes.to_s }, body]
  end
end
