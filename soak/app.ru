# frozen_string_literal: true

# The soak's app: a route per thing a long run should exercise.
class ChunkedBody
  PART = ("c" * 1000).freeze
  def each = 8.times { yield PART }
end

run lambda { |env|
  case env["PATH_INFO"]
  when "/hello" then [200, { "content-type" => "text/plain" }, ["hello world\n"]]
  when "/chunked" then [200, { "content-type" => "text/plain" }, ChunkedBody.new] # streamed, chunked
  when "/echo"
    body = env["rack.input"].read
    [200, { "content-type" => "text/plain" }, ["#{body.bytesize}\n"]]
  when "/error" then raise "soak: deliberate app error"
  else [404, {}, ["not found\n"]]
  end
}
