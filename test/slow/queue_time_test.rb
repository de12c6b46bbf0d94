# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "open3"

# Queue time: seconds from a request's arrival (the worker's wake-up to the read that completed
# it, or a proxy's X-Request-Start when earlier) to the app's start. In env["blackbuck.queue_time"],
# in /metrics as Prometheus histograms (with the duration), as recent p50/p99 in /status and
# `blackbuck status`; max_queue_time sheds what waited too long.
class QueueTimeTest < ServerTest
  def start(args = [])
    dir = Dir.mktmpdir("bb-test")
    @stats = "#{dir}/stats.sock"
    start_server(["-l", "127.0.0.1:0", "--stats-listen", "unix:#{@stats}", *args], app: "kitchen.ru", dir: dir)
  end

  def stats(path)
    io = UNIXSocket.new(@stats)
    request(io, "GET", path).body
  ensure
    io&.close
  end

  def queue_time(server, headers = {})
    io = server.tcp
    Float(request(io, "GET", "/queue-time", headers: headers).body)
  ensure
    io&.close
  end

  def test_x_request_start_in_every_unit_and_implausible_ones_ignored
    server = start
    t = Time.now.to_f - 2.0
    ["t=#{format('%.3f', t)}", "t=#{(t * 1000).to_i}", "t=#{(t * 1_000_000).to_i}", "t=#{(t * 1e9).to_i}",
     format("%.3f", t)].each do |value|
      q = queue_time(server, "X-Request-Start" => value)
      assert_in_delta 2.0, q, 0.5, "X-Request-Start: #{value}"
    end
    ["t=#{(Time.now.to_f - 7200).to_i}", "t=#{(Time.now.to_f + 60).to_i}", "t=abc", "t=", "t=1.2.3",
     "t=99999999999999999999999"].each do |value|
      assert_operator queue_time(server, "X-Request-Start" => value), :<, 0.5, "ignored: #{value}"
    end
    assert_operator queue_time(server), :<, 0.5
  end

  # Two requests in one write: the second waits in the worker's buffer while the first runs 0.5 s.
  def test_a_request_waiting_behind_another_is_counted_and_shows_in_metrics_and_status
    server = start
    io = server.tcp
    io.write("GET /sleep?t=0.5 HTTP/1.1\r\nHost: x\r\n\r\nGET /queue-time HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 200, read_response(io).status
    waited = Float(read_response(io).body)
    assert_in_delta 0.5, waited, 0.25, "the second request waited while the first ran"
    3.times { assert_equal 200, request(io, "GET", "/hello").status }

    metrics = stats("/metrics")
    count = metrics[/^blackbuck_request_queue_seconds_count (\d+)$/, 1].to_i
    assert_equal 5, count, "one queue sample per request"
    buckets = metrics.scan(/^blackbuck_request_queue_seconds_bucket\{le="([^"]+)"\} (\d+)$/)
    assert_equal "+Inf", buckets.last[0]
    assert_equal count, buckets.last[1].to_i
    assert_equal buckets.map { |_, n| n.to_i }.sort, buckets.map { |_, n| n.to_i }, "cumulative"
    assert_operator buckets.find { |le, _| le == "0.25" }[1].to_i, :<, count, "one sample above 0.25 s"
    assert_operator metrics[/^blackbuck_request_queue_seconds_sum ([\d.]+)$/, 1].to_f, :>=, 0.25
    assert_equal 5, metrics[/^blackbuck_request_duration_seconds_count (\d+)$/, 1].to_i
    assert_operator metrics[/^blackbuck_request_duration_seconds_sum ([\d.]+)$/, 1].to_f, :>=, 0.5

    recent = JSON.parse(stats("/status"))["recent"]
    assert_equal 5, recent["requests"]
    assert_operator recent["queue_time"]["p99"], :>=, 0.25
    assert_operator recent["duration"]["p99"], :>=, 0.25
    out, = Open3.capture2(RbConfig.ruby, EXE, "status", "unix:#{@stats}")
    assert_match(/5 requests  queue p50 [\d.]+ms p99 [\d.]+ms  app p50/, out)
  ensure
    io&.close
  end

  def test_max_queue_time_sheds_what_waited_too_long
    server = start(["--max-queue-time", "0.2"])
    io = server.tcp
    io.write("GET /sleep?t=0.5 HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 200, read_response(io).status
    shed = read_response(io)
    assert_equal 503, shed.status
    assert_equal "1", shed["retry-after"]
    assert_equal 200, request(io, "GET", "/hello").status, "the connection stays usable; fresh requests run"
    assert_equal 1, stats("/metrics")[/^blackbuck_requests_shed_total (\d+)$/, 1].to_i
    assert_equal 1, JSON.parse(stats("/status"))["totals"]["shed"]
    # a proxy's stamp counts too: a request that spent 1 s before reaching us is shed at once
    res = request(io, "GET", "/hello", headers: { "X-Request-Start" => "t=#{format('%.3f', Time.now.to_f - 1)}" })
    assert_equal 503, res.status
  ensure
    io&.close
  end

  def test_histograms_survive_worker_recycling
    server = start(["--max-requests-per-child", "3"])
    7.times do
      io = server.tcp
      assert_equal 200, request(io, "GET", "/hello").status
      io.close
    end
    wait_for { server.log.scan(/exited with status 0/).size >= 2 }
    # the live worker counts its last request just after its answer has gone out: wait for it
    metrics = wait_for(15, "7 requests counted") do
      m = stats("/metrics")
      m if m[/^blackbuck_request_duration_seconds_count (\d+)$/, 1].to_i >= 7
    end
    assert_equal 7, metrics[/^blackbuck_request_queue_seconds_count (\d+)$/, 1].to_i
    assert_equal 7, metrics[/^blackbuck_request_duration_seconds_count (\d+)$/, 1].to_i
  end
end
