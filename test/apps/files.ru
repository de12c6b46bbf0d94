# frozen_string_literal: true

# File downloads for test/integration/file_body_test.rb. BB_FILES_DIR is the directory the test
# fills; every route names a file in it by ?name=. Bodies count how often Ruby iterated them
# (GET /stats), so a test can tell a file sent by the server from one streamed through Ruby.
require "json"
require "pathname"
require "tempfile"
require "rack/files"
require "rack/sendfile"

FILES_DIR = ENV.fetch("BB_FILES_DIR")
COUNTS = Hash.new(0)

# A body that names its file, and can also be iterated (Rack's to_path contract).
class PathBody
  CHUNK = 64 * 1024

  def initialize(path, limit: nil)
    @path = path
    @limit = limit
  end

  def to_path = @path

  def each
    COUNTS[:each] += 1
    left = @limit || File.size(@path)
    File.open(@path, "rb") do |f|
      while left.positive? && (part = f.read([CHUNK, left].min))
        left -= part.bytesize
        yield part
      end
    end
  end

  def close = COUNTS[:close] += 1
end

# Rails' ActionDispatch::Response::RackBody: each, to_path, close, and a to_ary that answers nil.
class RailsLikeBody < PathBody
  def to_ary = nil
end

# A Tempfile that is removed when the body is closed (as apps that build a file per request do):
# the server must still send all of it.
class TempfileBody < PathBody
  def initialize(bytes)
    @file = Tempfile.new("bb-file-body", FILES_DIR)
    @file.binmode
    @file.write(Random.new(bytes).bytes(bytes)) # the test makes the same bytes
    @file.flush
    super(@file.path)
  end

  def close
    super
    @file.close!
  end
end

files = Rack::Files.new(FILES_DIR)
sendfile = Rack::Sendfile.new(files, "X-Sendfile")
accel = Rack::Sendfile.new(files, "X-Accel-Redirect", [[Regexp.escape(FILES_DIR), "/protected"]])

run lambda { |env|
  q = Rack::Utils.parse_query(env["QUERY_STRING"])
  file = File.join(FILES_DIR, q["name"].to_s)
  case env["PATH_INFO"]
  when "/hello" then [200, { "content-type" => "text/plain" }, ["hello world\n"]]
  when "/stats"
    [200, { "content-type" => "application/json" },
     [JSON.generate(COUNTS.merge(pid: Process.pid, objects: GC.stat(:total_allocated_objects)))]]
  when %r{\A/files/} then files.call(env.merge("PATH_INFO" => env["PATH_INFO"].delete_prefix("/files")))
  when %r{\A/rack-sendfile/} then sendfile.call(env.merge("PATH_INFO" => env["PATH_INFO"].delete_prefix("/rack-sendfile")))
  when %r{\A/rack-accel/} then accel.call(env.merge("PATH_INFO" => env["PATH_INFO"].delete_prefix("/rack-accel")))
  when "/path" then [200, { "content-type" => "application/octet-stream" }, PathBody.new(file)]
  when "/rails" then [200, { "content-type" => "application/octet-stream" }, RailsLikeBody.new(file)]
  when "/pathname" # send_file(Rails.root.join(...)): to_path answers a Pathname
    [200, { "content-type" => "application/octet-stream" }, RailsLikeBody.new(Pathname.new(file))]
  when "/tempfile" then [200, {}, TempfileBody.new(Integer(q.fetch("bytes")))]
  when "/length" # the app's own Content-Length, and a body whose each yields that many bytes
    n = Integer(q.fetch("length"))
    [200, { "content-length" => n.to_s }, PathBody.new(file, limit: n)]
  when "/partial" # a range answered by the app, with a body that still names the whole file
    n = Integer(q.fetch("length"))
    [206, { "content-length" => n.to_s, "content-range" => "bytes 0-#{n - 1}/#{File.size(file)}" },
     PathBody.new(file, limit: n)]
  when "/x-sendfile" # what Rack::Sendfile leaves: a path header, content-length 0, an empty body
    [200, { "x-sendfile" => q.fetch("path"), "content-length" => "0", "content-type" => "application/x-test" },
     Rack::BodyProxy.new([]) { COUNTS[:close] += 1 }]
  when "/x-sendfile-caps" then [200, { "X-Sendfile" => q.fetch("path") }, []]
  when "/x-accel" then [200, { "x-accel-redirect" => q.fetch("uri"), "content-length" => "0" }, []]
  else [404, {}, ["not found\n"]]
  end
}
