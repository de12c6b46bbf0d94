# frozen_string_literal: true

# Responses whose body is not a Rack body, or whose body fails before its first part
# (test/integration/invalid_body_test.rb); each answered 500 with a log line naming the problem.

# An `each` body that raises before it yields anything: nothing of the response has gone out yet.
class RaisingFirstBody
  def each = raise("boom before the first part")
  def close = nil
end

# An `each` body that takes longer than the request timeout before its first part.
class SlowFirstBody
  def each
    sleep 30
    yield "too late"
  end
end

# A valid `each` body that yields nothing: a 200 with an empty body.
class EmptyEachBody
  def each = nil
end

run lambda { |env|
  case env["PATH_INFO"]
  when "/string" then [200, { "content-type" => "text/plain" }, "hello"]
  when "/nil" then [200, { "content-type" => "text/plain" }, nil]
  when "/missing" then [200, { "content-type" => "text/plain" }] # a 2-element Array: no body at all
  when "/status-word" then ["OK", { "content-type" => "text/plain" }, ["ok"]]
  when "/status-1000" then [1000, { "content-type" => "text/plain" }, ["ok"]]
  when "/each-raise-first" then [200, { "content-type" => "text/plain" }, RaisingFirstBody.new]
  when "/each-slow-first" then [200, { "content-type" => "text/plain" }, SlowFirstBody.new]
  when "/each-empty" then [200, { "content-type" => "text/plain" }, EmptyEachBody.new]
  when "/hello" then [200, { "content-type" => "text/plain" }, ["hello world\n"]]
  else [404, {}, ["not found\n"]]
  end
}
