# frozen_string_literal: true

# Large responses with deterministic content, for the response-spill tests. Part i is 64 KiB of
# its own number ("000000000000042\n" repeated), so a lost, repeated or reordered part changes
# the digest. ?parts=N sets the count.
PART_BYTES = 64 * 1024
PART_LINE = 16 # "%015d\n"

module SpillParts
  def self.[](i) = format("%015d\n", i) * (PART_BYTES / PART_LINE)
end

class SpillEach
  def initialize(n) = @n = n
  def each = @n.times { |i| yield SpillParts[i] }
end

run lambda { |env|
  n = Integer(env["QUERY_STRING"][/parts=(\d+)/, 1] || 16)
  case env["PATH_INFO"]
  when "/hello" then [200, { "content-type" => "text/plain" }, ["hello world\n"]]
  when "/each" then [200, { "content-type" => "text/plain" }, SpillEach.new(n)]
  when "/callable"
    [200, { "content-type" => "text/plain" }, lambda { |stream|
      n.times { |i| stream.write(SpillParts[i]) }
      stream.close
    }]
  when "/array" then [200, { "content-type" => "text/plain" }, Array.new(n) { |i| SpillParts[i] }]
  when "/early-each"
    env["rack.early_hints"].call({ "link" => "</a.css>; rel=preload" })
    [200, { "content-type" => "text/plain" }, SpillEach.new(n)]
  else [404, {}, ["not found\n"]]
  end
}
