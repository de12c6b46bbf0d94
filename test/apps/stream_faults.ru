# frozen_string_literal: true

# Faults with many open streams (test/faults/streams_fault_test.rb): SSE bodies that send a few events,
# then wait at a gate the test opens, on servers with several workers and --streams.
#
# The gate is a FIFO, $BB_STREAM_GATE, opened here (in the master: every worker inherits it) for
# reading, non-blocking. A body waits for it to become readable (IO#wait_readable: under the worker's
# fiber scheduler a wait in its poller, no polling and no timer), and the test opens it for all the
# workers at once by writing a byte and closing its end: nobody reads the byte, so it stays open.
#
#   GET /sse?pre=K&post=M&gap=S   K events at once, the gate, then M events S seconds apart (events
#                                 numbered 1..K+M, "data: N\n\n"); M may be large (the stream runs
#                                 until its client goes)
#   GET /sse?...&gate=0           no gate: K+M events, the last M S seconds apart
#   GET /raise?pre=K              K events, the gate, then the body raises (gate=0: a sleep of gap)
#   GET /flood?pre=K              K events, then 16 KiB events as fast as the client takes them, for ever
#                                 (a client that stops reading holds the body at the high-water mark)
#   GET /fibers                   this worker's "pid=P fibers=F opened=O closed=C": its live
#                                 non-blocking fibers after a full GC (stream fibers left alive: a leak),
#                                 and the stream bodies it made and closed
#   GET /                         hello
# Every answer says which worker gave it (x-worker-pid).
require "io/wait" # (IO#wait_readable on Ruby 3.1)

GATE = File.open(ENV.fetch("BB_STREAM_GATE"), File::RDONLY | File::NONBLOCK)
BODIES = { opened: 0, closed: 0 } # rubocop:disable Style/MutableConstant -- this worker's counts

# An `each` body that counts itself made and closed.
class CountedBody
  def initialize(&each)
    @each = each
    BODIES[:opened] += 1
  end

  def each(&) = @each.call(&)
  def close = BODIES[:closed] += 1
end

def event(i) = "data: #{i}\n\n"

def params(env) = env["QUERY_STRING"].to_s.split("&").to_h { |kv| kv.split("=", 2) }

# Live fibers that are no thread's root fiber (those are blocking): the stream fibers still alive.
def live_fibers
  GC.start
  ObjectSpace.each_object(Fiber).count { |f| f.alive? && !f.blocking? }
end

run(lambda do |env|
  q = params(env)
  pid = { "x-worker-pid" => Process.pid.to_s }
  sse = pid.merge("content-type" => "text/event-stream", "cache-control" => "no-cache")
  pre = (q["pre"] || 2).to_i
  case env["PATH_INFO"]
  when "/sse"
    post = (q["post"] || 3).to_i
    gap = (q["gap"] || 0.05).to_f
    [200, sse, CountedBody.new do |&y|
      (1..pre).each { |i| y.call(event(i)) }
      GATE.wait_readable unless q["gate"] == "0"
      (1..post).each do |i|
        sleep gap
        y.call(event(pre + i))
      end
    end]
  when "/raise"
    [200, sse, CountedBody.new do |&y|
      (1..pre).each { |i| y.call(event(i)) }
      q["gate"] == "0" ? sleep((q["gap"] || 0.05).to_f) : GATE.wait_readable
      raise "the body fails midway"
    end]
  when "/flood"
    part = "data: #{'x' * 16_384}\n\n"
    [200, sse, CountedBody.new do |&y|
      (1..pre).each { |i| y.call(event(i)) }
      loop { y.call(part) }
    end]
  when "/fibers"
    body = "pid=#{Process.pid} fibers=#{live_fibers} opened=#{BODIES[:opened]} closed=#{BODIES[:closed]}\n"
    [200, pid.merge("content-type" => "text/plain"), [body]]
  else
    [200, pid.merge("content-type" => "text/plain"), ["hello\n"]]
  end
end)
