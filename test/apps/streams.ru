# frozen_string_literal: true

# Long streams (test/integration/streams_test.rb): bodies that wait between their parts, on a server
# run with --workers 1. State the tests wait for is in this process (one worker): the gate the
# streams' last event waits behind, and the bodies closed.
#
#   GET /sse?n=N&gap=S            N events S seconds apart (sleep); &late=1: the first waits for /release
#   GET /release                  opens the gate: with &gated=1, the last part of /sse, /live and /call
#                                 (and /raise's raise) waits for it (polling it with sleep)
#   GET /live?n=N                 ActionController::Live's shape: a thread pushes N events into a Queue
#                                 the body pops (then :done)
#   GET /call?n=N&gap=S           a Rack 3 callable body: N writes S seconds apart
#   GET /raise                    one event, a wait, then the body raises
#   GET /big?n=N                  N parts of 64 KiB, as fast as the client takes them (no wait of its own)
#   GET /late-callback            data: 1, then adds a rack.response_finished callback (counted in
#                                 late), data: 2, then the gate (gated=1), data: 3
#   GET /spin                     data: 1, a wait, then a run that spins past --timeout (the request
#                                 timeout in a stream's run: it is cut, the worker replaced)
#   GET /rescue-then-stream       app.call spins past --timeout, rescues the notice, and returns a
#                                 gated stream (the worker is replaced all the same)
#   GET /stats                    "closed=C finished=F late=L": bodies closed, rack.response_finished
#                                 callbacks run, late-added ones run
#   GET /                         hello
GATE = { open: false } # rubocop:disable Style/MutableConstant -- the tests' gate, this process's
COUNTS = { closed: 0, finished: 0, late: 0 } # rubocop:disable Style/MutableConstant

# An `each` body that counts its close.
class Events
  def initialize(&each) = @each = each
  def each(&) = @each.call(&)
  def close = COUNTS[:closed] += 1
end

SSE = { "content-type" => "text/event-stream", "cache-control" => "no-cache" }.freeze

def params(env) = env["QUERY_STRING"].to_s.split("&").to_h { |kv| kv.split("=", 2) }

# Before the last part of a gated stream: waits (sleeping) until /release.
def gate(last, gated, gap)
  if last && gated
    sleep 0.01 until GATE[:open]
  else
    sleep gap
  end
end

# Busy until the request timeout's notice interrupts it (30 s at most: a test's bound, not its measure).
def spin
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 30
end

run(lambda do |env|
  q = params(env)
  env["rack.response_finished"] << ->(*) { COUNTS[:finished] += 1 }
  n = (q["n"] || 3).to_i
  gap = (q["gap"] || 0.05).to_f
  case env["PATH_INFO"]
  when "/sse"
    [200, SSE, Events.new do |&y|
      (1..n).each do |i|
        gate(i == n, q["gated"], gap) if i > 1
        gate(true, true, gap) if i == 1 && q["late"] # (the first part waits for /release)
        y.call("data: #{i}\n\n")
      end
    end]
  when "/release"
    GATE[:open] = true
    [200, {}, ["released\n"]]
  when "/live"
    queue = Thread::Queue.new
    Thread.new do
      n.times do |i|
        gate(i == n - 1, q["gated"], gap)
        queue.push("data: #{i + 1}\n\n")
      end
      queue.push(:done)
    end
    [200, SSE, Events.new do |&y|
      while (part = queue.pop) != :done
        y.call(part)
      end
    end]
  when "/call"
    [200, {}, lambda do |stream|
      n.times do |i|
        gate(i == n - 1, q["gated"], gap) if i.positive?
        stream.write("part #{i + 1}\n")
      end
    ensure
      stream.close
    end]
  when "/raise"
    [200, SSE, Events.new do |&y|
      y.call("data: 1\n\n")
      gate(true, q["gated"], gap)
      raise "the body fails midway"
    end]
  when "/big"
    part = "x" * 65_536
    [200, {}, Events.new { |&y| n.times { y.call(part) } }]
  when "/late-callback"
    [200, SSE, Events.new do |&y|
      y.call("data: 1\n\n")
      sleep gap
      env["rack.response_finished"] << ->(*) { COUNTS[:late] += 1 }
      y.call("data: 2\n\n")
      gate(true, q["gated"], gap)
      y.call("data: 3\n\n")
    end]
  when "/spin"
    [200, SSE, Events.new do |&y|
      y.call("data: 1\n\n")
      sleep gap
      spin
      y.call("data: 2\n\n")
    end]
  when "/rescue-then-stream"
    begin
      spin
    rescue Blackbuck::RequestTimeout
      nil # (an app that answers itself: Rails' ShowExceptions does)
    end
    [200, SSE, Events.new do |&y|
      y.call("data: 1\n\n")
      gate(true, "1", gap)
      y.call("data: 2\n\n")
    end]
  when "/stats"
    [200, {}, ["closed=#{COUNTS[:closed]} finished=#{COUNTS[:finished]} late=#{COUNTS[:late]}\n"]]
  else
    [200, { "content-type" => "text/plain" }, ["hello\n"]]
  end
end)
