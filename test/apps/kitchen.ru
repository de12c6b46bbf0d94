# frozen_string_literal: true

# One app with a route per behaviour the integration tests check.
require "json"
require "digest"
Digest::SHA256 # loaded now: Digest loads it lazily, which is not thread-safe (--threads: "cannot be directly inherited")

STARTED = Process.clock_gettime(Process::CLOCK_MONOTONIC)

class EachBody
  def initialize(parts) = @parts = parts
  def each(&) = @parts.each(&)
  def close = (File.write(ENV["BB_CLOSE_MARK"], "closed") if ENV["BB_CLOSE_MARK"])
end

# Rails 6.1's response body: `to_ary` exists but answers nil ("not convertible").
class NilToAryBody < EachBody
  def to_ary = nil
end

# /overlap: how many requests ran at once in this worker, at most, by the end of this one.
OVERLAP = { now: 0, max: 0, lock: Mutex.new }

run lambda { |env|
  path = env["PATH_INFO"]
  case path
  when "/hello" then [200, { "content-type" => "text/plain" }, ["hello world\n"]]
  when "/env"
    info = env.select { |_k, v| v.is_a?(String) }
    info["worker.pid"] = Process.pid.to_s
    info["rack.early_hints?"] = env.key?("rack.early_hints").to_s
    info["rack.response_finished.size"] = env["rack.response_finished"].size.to_s # callbacks before the app's
    env["rack.response_finished"] << ->(*) {} # one more: the next request must not see it
    [200, { "content-type" => "application/json" }, [JSON.generate(info)]]
  when "/each" then [200, { "content-type" => "text/plain" }, EachBody.new(%w[a bb ccc])]
  when "/each-raise" # fails after the head and a first chunk went out
    body = Object.new
    def body.each
      yield "first"
      raise "boom in the middle of the body"
    end
    [200, { "content-type" => "text/plain" }, body]
  when "/nil-to-ary" then [302, { "location" => "/hello" }, NilToAryBody.new(%w[moved here])]
  when "/each-length" then [200, { "Content-Length" => "6" }, EachBody.new(%w[a bb ccc])]
  when "/callable"
    [200, {}, ->(stream) { stream.write("streamed "); stream.write("body"); stream.close }]
  when "/iovmax"
    n = Integer(env["QUERY_STRING"][/n=(\d+)/, 1] || 3000)
    [200, {}, Array.new(n) { |i| "#{i}," }]
  when "/big" then [200, {}, ["x" * (Integer(env["QUERY_STRING"][/n=(\d+)/, 1] || 65_536))]]
  when "/echo"
    body = env["rack.input"].read
    [200, { "x-input-class" => env["rack.input"].class.name, "x-content-length" => env["CONTENT_LENGTH"].to_s,
            "x-sha256" => Digest::SHA256.hexdigest(body) }, [body]]
  when "/status" then [Integer(env["QUERY_STRING"][/s=(\d+)/, 1]), {}, []]
  when "/headers" then [200, { "set-cookie" => ["a=1", "b=2"], "x-multi" => "one\ntwo" }, ["ok"]]
  when "/sleep"
    sleep Float(env["QUERY_STRING"][/t=([\d.]+)/, 1] || 1)
    [200, {}, ["slept\n"]]
  when "/overlap"
    OVERLAP[:lock].synchronize { OVERLAP[:max] = [OVERLAP[:max], OVERLAP[:now] += 1].max }
    begin
      sleep Float(env["QUERY_STRING"][/t=([\d.]+)/, 1] || 0.2)
    ensure
      OVERLAP[:lock].synchronize { OVERLAP[:now] -= 1 }
    end
    [200, {}, ["max=#{OVERLAP[:max]} multithread=#{env['rack.multithread']} pid=#{Process.pid}"]]
  when "/raise" then raise "boom from the app"
  when "/stubborn" # swallows the timeout notice: only SIGKILL stops it
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      begin
        sleep 0.1
      rescue Exception # rubocop:disable Lint/RescueException
        nil
      end
    end
    [200, {}, ["never"]]
  when "/bad-triplet" then [200, "not a hash", ["x"]]
  when "/bad-part" then [200, {}, [:not_a_string]]
  when "/bad-header" then [200, { "x-evil" => "a\r\nInjected: yes" }, ["x"]]
  when "/hijack"
    io = env["rack.hijack"].call
    io.write("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
    io.close
    [200, {}, []]
  when "/finished"
    env["rack.response_finished"] << ->(*) { File.write(ENV["BB_FINISHED_MARK"], "finished") }
    [200, {}, ["ok"]]
  when "/close-input" # Rack forbids it; an app may do it anyway
    env["rack.input"].close
    [200, {}, ["closed"]]
  when "/early"
    env["rack.early_hints"].call({ "link" => ["</a.css>; rel=preload", "</b.js>; rel=preload"] })
    [200, {}, ["after hints"]]
  when "/close-header" then [200, { "connection" => "close" }, ["bye"]]
  when "/stream-big"
    n = Integer(env["QUERY_STRING"][/n=(\d+)/, 1])
    [200, {}, Enumerator.new { |y| (n / 65_536).times { y << ("s" * 65_536) } }]
  when "/gc-count" then [200, {}, [GC.count.to_s]]
  when "/queue-time" then [200, {}, [env["blackbuck.queue_time"].inspect]]
  when "/uptime" then [200, {}, [(Process.clock_gettime(Process::CLOCK_MONOTONIC) - STARTED).to_s]]
  else [404, {}, ["not found\n"]]
  end
}
