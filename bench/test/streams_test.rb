# frozen_string_literal: true

# The streams workload (issue 35) without a server: the stream client's parsing of each framing,
# its aggregation (time to first event over every stream requested), one loop over a socket this
# test serves itself, the row's derived figures, the targets, the report's table, and the plan
# (a full run has it, bench:quick does not). Run: ruby bench/test/streams_test.rb (or rake bench:test)
require "minitest/autorun"
require_relative "fake_rubies"
require "socket"
require_relative "../lib/blackbuck_bench/runner"
require_relative "../lib/blackbuck_bench/sse_client"

class StreamsTest < Minitest::Test
  include FakeRubies
  include BlackbuckBench

  def setup
    super
    @saved_ruby = ServerRuby.current
    ServerRuby.current = FakeRubies::DEBIAN_31
  end

  def teardown
    ServerRuby.current = @saved_ruby
    super
  end

  Stream = SseClient::Stream

  def event(i) = "id: #{i}\ndata: event #{i}\n\n"

  def chunked(events) = events.map { |e| "#{e.bytesize.to_s(16)}\r\n#{e}\r\n" }.join + "0\r\n\r\n"

  HEAD_CHUNKED = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
  HEAD_EOF = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"

  # feeds the bytes in pieces of `size`, the clock advancing 0.1 s a piece
  def feed(stream, bytes, size)
    t = 10.0
    bytes.bytes.each_slice(size) { |piece| stream.feed(piece.pack("C*"), t += 0.1) }
    t
  end

  def test_chunked_stream_in_any_pieces
    raw = HEAD_CHUNKED + chunked((0...3).map { |i| event(i) })
    [1, 2, 7, raw.bytesize].each do |size|
      s = Stream.new(expected: 3, due_s: 10.0)
      feed(s, raw, size)
      assert s.complete?, "pieces of #{size}: #{s.to_h}"
      assert_equal [3, "chunked"], [s.events, s.to_h["framing"]]
    end
  end

  def test_first_event_time_is_from_the_due_time
    s = Stream.new(expected: 2, due_s: 5.0)
    s.feed(HEAD_CHUNKED, 5.2)
    assert_nil s.ttfe_s
    s.feed("#{event(0).bytesize.to_s(16)}\r\n#{event(0)}", 5.5) # an event half-framed
    assert_in_delta 0.5, s.ttfe_s
    s.feed("\r\n#{chunked([event(1)])}", 5.6)
    assert s.complete?
    assert_in_delta 0.6, s.to_h["duration_s"]
  end

  def test_an_event_split_across_chunks_counts_once
    raw = HEAD_CHUNKED + chunked(["id: 0\ndata: ev", "ent 0\n", "\n", event(1)])
    s = Stream.new(expected: 2)
    feed(s, raw, 3)
    assert s.complete?
    assert_equal 2, s.events
  end

  def test_close_delimited_stream_ends_at_eof
    s = Stream.new(expected: 2)
    t = feed(s, HEAD_EOF + event(0) + event(1), 5)
    refute s.done?
    s.eof(t + 0.1)
    assert s.complete?
    assert_equal "eof", s.to_h["framing"]
  end

  def test_content_length_stream
    body = event(0) + event(1)
    s = Stream.new(expected: 2)
    feed(s, "HTTP/1.1 200 OK\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}", 4)
    assert s.complete?
  end

  def test_incomplete_streams_say_why
    short = Stream.new(expected: 3)
    t = feed(short, HEAD_CHUNKED + "#{event(0).bytesize.to_s(16)}\r\n#{event(0)}\r\n", 64)
    short.eof(t)
    refute short.complete?
    assert_equal "closed before the end of the chunked body", short.error
    assert_equal 1, short.events

    few = Stream.new(expected: 3) # ended properly, but with fewer events than asked for
    feed(few, HEAD_CHUNKED + chunked([event(0)]), 64)
    assert few.done?
    refute few.complete?

    error = Stream.new(expected: 1)
    error.feed("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", 1.0)
    assert_equal "status 503", error.error
    bad = Stream.new(expected: 1)
    bad.feed("#{HEAD_CHUNKED}zz\r\n", 1.0)
    assert_match(/bad chunk size/, bad.error)
    none = Stream.new(expected: 1)
    none.eof(1.0)
    assert_equal "closed before the response head", none.error
  end

  def test_percentile_counts_streams_without_an_event_as_later_than_any
    assert_equal 99, SseClient.percentile((1..100).to_a, 99)
    assert_equal 100, SseClient.percentile((1..100).to_a.shuffle, 100)
    assert_equal 99, SseClient.percentile((1..99).to_a + [nil], 99), "1% without: p99 is the last real one"
    assert_nil SseClient.percentile((1..98).to_a + [nil, nil], 99), "2% without: p99 is 'never'"
    assert_nil SseClient.percentile([], 50)
  end

  def test_summary_over_every_stream_requested
    done = { "status" => 200, "events" => 30, "ttfe_s" => 0.002, "complete" => true, "framing" => "chunked", "duration_s" => 2.91 }
    late = done.merge("ttfe_s" => 0.5, "duration_s" => 3.4)
    cut = { "status" => 200, "events" => 4, "ttfe_s" => 9.0, "complete" => false, "framing" => "eof",
            "error" => "unfinished at the bound (19 s)" }
    streams = [done] * 97 + [late, cut]
    s = SseClient.summarize(streams, requested: 100)
    assert_equal [100, 98, 99, 97 * 30 + 30 + 4], s.values_at("requested", "completed", "with_first_event", "events")
    assert_equal({ "unfinished at the bound (19 s)" => 1, "never opened" => 1 }, s["failures"])
    # 100 requested: 97 at 2 ms, 500 ms, 9 s (cut later), and one never opened (later than any)
    assert_in_delta 9000.0, s["ttfe_p99_ms"], 0.01, "the 99th of 100"
    assert_in_delta 500.0, SseClient.summarize(streams + [done], requested: 100)["ttfe_p99_ms"], 0.01
    assert_in_delta 2.0, s["ttfe_p50_ms"]
    assert_in_delta 9000.0, s["ttfe_max_ms"]
    assert_equal({ "chunked" => 98, "eof" => 1 }, s["framing"])
    assert_nil SseClient.summarize([cut] * 3, requested: 100)["ttfe_p99_ms"], "97 never had an event"
  end

  # The loop against a server this test runs on a thread: 3 streams of 2 events, one of them
  # refused with 503; the clock is the real one.
  def test_the_loop_reads_streams_from_a_socket
    server = TCPServer.new("127.0.0.1", 0)
    port = server.addr[1]
    served = Thread.new do
      3.times.map do |i|
        c = server.accept
        c.readpartial(4096)
        if i == 1
          c.write("HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n")
        else
          c.write(HEAD_CHUNKED)
          c.write(chunked([event(0), event(1)]))
        end
        c.close
      end
    end
    streams = SseClient.run(port: port, streams: 3, events: 2, interval_ms: 0, ramp_s: 0.05, bound_s: 5)
    served.join(5)
    assert_equal [true, false, true], streams.map(&:complete?)
    assert_equal "status 503", streams[1].error
    assert streams.all? { |s| s.ttfe_s.nil? || s.ttfe_s.between?(0, 5) }
  ensure
    server&.close
  end

  def test_the_loop_stops_at_the_bound
    server = TCPServer.new("127.0.0.1", 0) # accepts (backlog) and never answers
    streams = SseClient.run(port: server.addr[1], streams: 2, events: 2, interval_ms: 0, ramp_s: 0, bound_s: 0.3)
    assert_equal ["unfinished at the bound (0.3 s)"] * 2, streams.map(&:error)
  ensure
    server&.close
  end

  # --- the row, the targets, the report ---

  def fast(p99, rps = 10_000.0) = Result.new(requests: 20_000, seconds: 2.0, rps: rps, p50_ms: p99 / 4, p99_ms: p99, errors: 0, error_detail: {})

  def summary(completed, ttfe_p99) = { "requested" => 1000, "completed" => completed, "ttfe_p99_ms" => ttfe_p99, "failures" => {} }

  def derive(completed:, ttfe:, with:, alone:, delta_kb:)
    Streams.derive(summary: summary(completed, ttfe), fast_with: fast(with), fast_alone: fast(alone),
                   before: { "total_pss_kb" => 100_000, "processes" => [] },
                   peak: { "total_pss_kb" => 100_000 + delta_kb }, ending: { "total_pss_kb" => 120_000 })
      .merge("clients" => summary(completed, ttfe))
  end

  def test_derived_figures
    d = derive(completed: 1000, ttfe: 5.0, with: 3.0, alone: 1.0, delta_kb: 20_000)
    assert_equal 3.0, d["fast_p99_ratio"]
    assert_equal 20.0, d["pss_kb_per_stream"]
    refute d["memory_before"].key?("processes")
  end

  def test_targets_pass_fail_and_missing
    rows = { "blackbuck-streams+yjit" => derive(completed: 1000, ttfe: 4.0, with: 1.5, alone: 1.0, delta_kb: 10_000),
             "falcon+yjit" => derive(completed: 1000, ttfe: 5.0, with: 1.2, alone: 1.0, delta_kb: 30_000),
             "blackbuck-streams" => derive(completed: 10, ttfe: nil, with: 900, alone: 1.0, delta_kb: 0) }
    t = Streams.evaluate(rows)
    assert_equal [true, true, true, true], t.map { |x| x["pass"] }, "the +yjit pair, as on 3.4"
    assert_equal ["blackbuck-streams+yjit"], t.map { |x| x["server"] }.uniq
    assert_in_delta 0.333, t[2]["value"]
    assert_equal "falcon+yjit", t[3]["peer"]

    starved = Streams.derive(summary: summary(1000, 4.0), before: nil, peak: nil, ending: nil, fast_alone: fast(1.0),
                             fast_with: Result.new(requests: 0, rps: 0.0, p99_ms: 0.0, errors: 0, error_detail: {}))
    assert_equal [0, nil], starved.values_at("fast_requests", "fast_p99_ratio"), "no fast request: no p99 of 0 ms"
    t = Streams.evaluate("blackbuck-streams" => starved)
    assert_equal [false, "no fast request completed beside the streams"], t[1].values_at("pass", "note")

    t = Streams.evaluate(rows.slice("blackbuck-streams"))
    assert_equal [false, false, nil, nil], t.map { |x| x["pass"] }, "no Falcon row (3.1): the comparisons are n/a"
    assert_match(/falcon/, t[2]["missing"])
  end

  def test_report_has_a_streams_table_and_targets
    opts = BlackbuckBench.parse_options(%w[--only streams], env: {})
    steps = Plan.build(opts)
    ms = [["blackbuck-streams", 1000, 4.0], ["unicorn", 12, nil]].map do |name, completed, ttfe|
      Measurement.new(server: name, app: "streams", transport: "tcp", mode: "keepalive", rep: 0, status: "ok",
                      result: fast(ttfe ? 1.5 : 800.0), memory: { pss_kb_per_worker: 30_000 },
                      streams: derive(completed: completed, ttfe: ttfe, with: ttfe ? 1.5 : 800.0, alone: 1.0, delta_kb: 5_000))
    end
    ms << Measurement.new(server: "falcon", app: "streams", transport: "tcp", mode: "keepalive", rep: 0, status: "absent",
                          reason: "executable not found")
    report = Report.new(opts: opts, command: "test", machine: {}, driver: Drivers.build("blackbuck-load"), servers: {},
                        measurements: ms, crosscheck: [], started: Time.now, finished: Time.now, plan: steps)
    md = report.send(:tables_md)
    assert_match(/^\| blackbuck-streams \| 1,000 \/ 1,000 \| .* \| 4\.0 \| 10,000 \| 1\.50 \| 1\.00 \| 1\.50 \| 5\.0 \|/, md)
    assert_match(/^\| unicorn \| 12 \/ 1,000 \| .* \| > 19 s \|/, md)
    assert_match(/^\| falcon \| \*\*absent\*\* \| executable not found/, md)
    assert_match(/^\| all streams complete \| blackbuck-streams \| – \| 1,000 \| = 1,000 \| \*\*pass\*\* \|/, md)
    assert_match(/^\| PSS per stream \/ falcon's \| .* n\/a \(falcon\) \|/, md)
    assert_equal 4, report.document["streams_targets"].size
  end

  # --- the plan ---

  def test_a_full_run_has_the_streams_rows_and_quick_does_not
    full = BlackbuckBench.parse_options([], env: {})
    step = Plan.build(full).find { |s| s.workload.streams? }
    # on 3.1: no Falcon run is possible (absent when it runs) and no M:N Puma
    assert_equal %w[blackbuck blackbuck-streams blackbuck-streams-2x5 unicorn puma8-2x5 pitchfork iodine-2x1 falcon].sort,
                 step.servers.sort
    assert_equal [2, 20, 2.0], [step.workers, step.connections, step.duration]
    refute(Plan.build(full).any? { |s| !s.workload.streams? && s.servers.any? { |n| n.start_with?("blackbuck-streams", "puma8-2x32") } })
    quick = BlackbuckBench.parse_options(%w[--quick], env: {})
    refute(Plan.build(quick).any? { |s| s.workload.streams? }, "bench:quick does not run it")
    only = BlackbuckBench.parse_options([], env: { "BENCH_ONLY" => "streams" })
    assert_equal %w[streams], only[:workloads]
  end

  def test_on_34_the_yjit_twins_and_puma_on_mn_threads
    opts = BlackbuckBench.parse_options(%w[--only streams], env: {}).merge(server_ruby: RUBY_34)
    servers = Plan.build(opts).first.servers
    assert_equal %w[blackbuck+yjit blackbuck-streams+yjit blackbuck-streams-2x5+yjit falcon+yjit puma8-2x5+yjit
                    puma8-2x32-mn+yjit unicorn+yjit pitchfork+yjit iodine-2x1+yjit].sort, servers.sort
    with_server_ruby(RUBY_34) do
      assert_equal({ "RUBY_MN_THREADS" => "1", "RUBY_YJIT_ENABLE" => "1" }, Servers.fetch("puma8-2x32-mn+yjit").env)
      assert_equal "streams", Servers.fetch("blackbuck-streams+yjit").only
    end
    est = Plan.estimate(Plan.build(opts), opts, present: ->(_) { true })
    assert_equal est[:seconds], est[:streams_seconds], "only the streams rows: no cross-check"
    assert_operator est[:streams_seconds], :<, Plan::STREAMS_BUDGET_S
  end

  def test_the_blackbuck_row_has_streams_on
    ctx = LaunchContext.new(app_name: "streams", app_path: "/app.ru", workers: 2, tcp_port: 4000,
                            unix_path: "/tmp/s.sock", dir: Dir.tmpdir, root: "/root")
    assert_includes Servers.fetch("blackbuck-streams").command(ctx)[:argv], "--streams"
    refute_includes Servers.fetch("blackbuck").command(ctx)[:argv], "--streams"
  end
end
