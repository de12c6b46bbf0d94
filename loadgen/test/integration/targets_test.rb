# frozen_string_literal: true

require_relative "helper"

# --target / --targets / --target-per-connection against the :routes fixture
# (/slow... answers after 50 ms, /missing... is a 404, anything else at once),
# which counts requests by request line and which lines each connection carried.
class TargetsTest < Minitest::Test
  include LoadgenHelper

  SLOW_S = 0.05
  UNIT_US = { "us" => 1, "ms" => 1_000, "s" => 1_000_000, "m" => 60_000_000 }.freeze

  def with_routes(&block) = with_fixture(:routes, unix: true, delay: SLOW_S, &block)

  # The "Per target" block: {"GET /fast" => {requests:, share:, avg:, p50:, p90:, p99:, max:, non2xx:, errors:}}.
  # Every line of the block has the header's length (the columns line up).
  def target_rows(out)
    lines = out.lines
    i = lines.index { |l| l.start_with?("  Per target ") } or flunk "no Per target block:\n#{out}"
    assert_match(/\A  Per target +Requests +Share +Avg +p50 +p90 +p99 +Max +Non-2xx +Errors\n\z/, lines[i])
    lines[(i + 1)..].to_h do |l|
      assert_equal lines[i].size, l.size, "misaligned:\n#{lines[i]}#{l}"
      m = l.match(/\A  (\S+ \S+) +(\d+) +(\d+\.\d)% +#{(['(\d+\.\d\d)(us|ms|s|m) *'] * 5).join} +(\d+) +(\d+)\n\z/)
      assert m, "bad Per target row: #{l.inspect}"
      lat = m.captures[3, 10].each_slice(2).map { |v, u| v.to_f * UNIT_US.fetch(u) }
      [m[1], { requests: m[2].to_i, share: m[3].to_f, avg: lat[0], p50: lat[1], p90: lat[2], p99: lat[3], max: lat[4],
               non2xx: m[14].to_i, errors: m[15].to_i }]
    end
  end

  # wrk's summary is all that comes before the block, and is intact.
  def assert_wrk_summary_then_targets(out)
    head, sep, = out.partition(/^  Per target /)
    refute_empty sep, out
    assert_wrk_report(head)
  end

  def label(t) = "#{t['method']} #{t['path']}"

  # Text and JSON agree, and the per-target numbers add up to the run's.
  def assert_consistent(r, j)
    rows = target_rows(r.out)
    assert_equal j["targets"].map { |t| label(t) }, rows.keys
    total = j["targets"].sum { |t| t["requests"] }
    assert_equal j["requests"], total, r.out
    assert_equal j["latency_us"]["count"], j["targets"].sum { |t| t["latency_us"]["count"] }
    %w[connect read write timeout status connect_retry].each do |k|
      assert_equal j["errors"][k], j["targets"].sum { |t| t["errors"][k] }, k
    end
    present = j["targets"].reject { |t| t["requests"].zero? }
    assert_equal j["latency_us"]["max"], present.map { |t| t["latency_us"]["max"] }.max
    assert_equal j["latency_us"]["min"], present.map { |t| t["latency_us"]["min"] }.min
    j["targets"].each do |t|
      row = rows.fetch(label(t))
      lat = t["latency_us"]
      assert_equal t["requests"], row[:requests]
      assert_equal t["requests"], lat["count"]
      assert_equal t["requests"], lat["histogram"].sum { |_, n| n }
      assert_equal t["non_2xx_3xx"], row[:non2xx]
      assert_equal t["errors"]["status"], t["non_2xx_3xx"]
      assert_equal %w[connect read write timeout].sum { |k| t["errors"][k] }, row[:errors]
      assert_in_delta 100.0 * t["requests"] / total, row[:share], 0.051 if total.positive?
      { avg: lat["mean"], p50: lat["percentiles"]["50"], p90: lat["percentiles"]["90"], p99: lat["percentiles"]["99"],
        max: lat["max"] }.each do |k, us|
        assert_in_delta us, row[k], [us * 0.006, 5].max, "#{label(t)} #{k}: text #{row[k]}us, JSON #{us}us"
      end
    end
    rows
  end

  def test_random_mix_follows_weights_and_reports_each_target_apart
    with_routes do |fx|
      r, j = run_json("-t", "2", "-c", "6", "-d", "2s", "--latency", "-P", fx.addr,
                      "--target", "GET /fast", "9", "--target", "GET /slow", "1", fx.url)
      assert_wrk_summary_then_targets(r.out)
      assert_consistent(r, j)
      fast, slow = j["targets"]
      assert_equal [["GET", "/fast", 9, nil], ["GET", "/slow", 1, nil]],
                   j["targets"].map { |t| t.values_at("method", "path", "weight", "connections") }
      assert_equal 1, j["config"]["seed"]
      refute j["config"]["target_per_connection"]
      assert_equal [0, 0, 0, 0], socket_errors_of(r.out), r.out
      # weights: the server saw each target in proportion (binomial: sd ~0.007 here)
      seen = fx.by_target
      assert_equal ["GET /fast", "GET /slow"], seen.keys.sort, "the URL's own path is not requested"
      assert_operator seen.values.sum, :>, 500, r.out
      assert_in_delta 0.1, seen["GET /slow"].to_f / seen.values.sum, 0.035, seen.inspect
      # the client's counts reconcile with the server's, target by target
      [fast, slow].each do |t|
        assert_operator seen[label(t)] - t["requests"], :>=, 0, r.out
        assert_operator seen[label(t)] - t["requests"], :<=, 6, r.out
      end
      # latency per target: the slow ones are all slow, the fast ones far below (their median: a stalled CPU stretches any one request)
      assert_operator slow["latency_us"]["min"], :>=, SLOW_S * 1e6, r.out
      assert_operator slow["latency_us"]["percentiles"]["50"], :>=, SLOW_S * 1e6, r.out
      assert_operator fast["latency_us"]["percentiles"]["50"], :<, SLOW_S * 1e6 / 2, r.out
    end
  end

  def test_pinned_connections_are_split_exactly
    # [threads, connections, weights, expected connections per target]
    [[2, 18, [16, 2], [16, 2]], [3, 7, [5, 2], [5, 2]], [2, 5, [1, 1, 1], [2, 2, 1]]].each do |threads, conns, weights, want|
      with_routes do |fx|
        paths = ["/fast", "/slow", "/other"].first(weights.size)
        targets = paths.zip(weights).flat_map { |p, w| ["--target", "GET #{p}", w.to_s] }
        r, j = run_json("-t", threads, "-c", conns, "-d", "1s", "-P", fx.addr, "--target-per-connection", *targets, fx.url)
        assert_consistent(r, j)
        assert j["config"]["target_per_connection"]
        assert_equal want, j["targets"].map { |t| t["connections"] }, r.out
        # the server's view: each connection carried one target only, and as many connections per target
        assert_equal paths.map { |p| "GET #{p}" }.zip(want).to_h, fx.connections_by_target, r.out
        slow = j["targets"][1]
        # closed model, 1 s, 50 ms each: at most 20 requests per slow connection
        assert_operator slow["requests"], :<=, want[1] * (1 / SLOW_S + 1), r.out
        assert_operator slow["requests"], :>=, want[1] * (0.5 / SLOW_S), r.out
        assert_operator slow["latency_us"]["percentiles"]["50"], :>=, SLOW_S * 1e6, r.out
        # the fast target's connections never wait behind a slow request (its median, not its tail:
        # a stalled CPU stretches any one request)
        assert_operator j["targets"][0]["latency_us"]["percentiles"]["50"], :<, SLOW_S * 1e6 / 2, r.out
      end
    end
  end

  def test_pipelined_targets_mixing_head_and_get
    # HEAD and GET responses differ in framing: a wrong guess about which is
    # which would misread the stream (read errors, timeouts, wrong byte counts).
    get_size = "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n".bytesize
    head_size = get_size - Fixture::BODY.bytesize
    [[], ["--target-per-connection"]].each do |pin|
      with_routes do |fx|
        r, j = run_json("-t", "1", "-c", "2", "-d", "1s", "--pipeline", "4", "-P", fx.addr, *pin,
                        "--target", "HEAD /a", "1", "--target", "GET /a", "1", fx.url)
        assert_consistent(r, j)
        assert_equal [0, 0, 0, 0], socket_errors_of(r.out), r.out
        head, get = j["targets"]
        assert_operator head["requests"], :>, 50, r.out
        assert_operator get["requests"], :>, 50, r.out
        assert_equal head["requests"] * head_size + get["requests"] * get_size, j["bytes"], r.out
        [head, get].each do |t|
          assert_operator fx.by_target[label(t)] - t["requests"], :>=, 0, r.out
          assert_operator fx.by_target[label(t)] - t["requests"], :<=, 8, r.out
        end
        if pin.empty?
          assert_equal({ nil => 2 }, fx.connections_by_target, "each pipelined request picks its own target")
        else
          assert_equal({ "HEAD /a" => 1, "GET /a" => 1 }, fx.connections_by_target)
        end
      end
    end
  end

  def test_pipelined_targets_with_large_bodies_survive_partial_writes
    # 8 x 256 KB per batch, each request its own target: far more than a socket
    # buffer, so the batch goes out in many partial writes that stop mid-request.
    Dir.mktmpdir("bl-body") do |dir|
      body = File.join(dir, "body")
      File.write(body, "b" * 262_144)
      with_routes do |fx|
        r, j = run_json("-t", "1", "-c", "2", "-d", "1s", "--pipeline", "8", "--body-file", body, "-P", fx.addr,
                        "--target", "POST /a", "1", "--target", "PUT /b", "1", fx.url, limit: 30)
        assert_consistent(r, j)
        assert_equal [0, 0, 0, 0], socket_errors_of(r.out), r.out
        assert_operator j["requests"], :>=, 16, r.out
        # every request reached the server whole and in order: no byte lost, repeated or moved
        assert_equal ["POST /a", "PUT /b"], fx.by_target.keys.sort
        assert_equal [Zlib.crc32(File.binread(body))], fx.bodies.keys, r.out
        j["targets"].each do |t|
          assert_operator fx.by_target[label(t)] - t["requests"], :>=, 0, r.out
          assert_operator fx.by_target[label(t)] - t["requests"], :<=, 16, r.out
        end
      end
    end
  end

  def test_no_keepalive_with_targets
    [[], ["--target-per-connection"]].each do |pin|
      with_routes do |fx|
        r, j = run_json("-t", "1", "-c", "2", "-d", "1s", "--no-keepalive", "-P", fx.addr, *pin,
                        "--target", "GET /a", "1", "--target", "GET /b", "1", fx.url)
        assert_consistent(r, j)
        assert_equal [0, 0, 0, 0], socket_errors_of(r.out), r.out
        assert_match(/^Connection: close\r$/, fx.last_request)
        a, b = j["targets"]
        assert_operator a["requests"], :>, 20, r.out
        assert_operator b["requests"], :>, 20, r.out
        # a connection per request, each carrying one target
        by_conn = fx.connections_by_target
        assert_equal fx.by_target["GET /a"], by_conn["GET /a"]
        assert_equal fx.by_target["GET /b"], by_conn["GET /b"]
        assert_in_delta a["requests"], by_conn["GET /a"], 2, r.out
        assert_in_delta b["requests"], by_conn["GET /b"], 2, r.out
        assert_equal [1, 1], j["targets"].map { |t| t["connections"] } unless pin.empty?
      end
    end
  end

  def test_rate_with_targets
    with_routes do |fx|
      r, j = run_json("-t", "1", "-c", "4", "-d", "2s", "-R", "200", "-P", fx.addr,
                      "--target", "GET /a", "3", "--target", "GET /b", "1", fx.url)
      assert_consistent(r, j)
      assert_in_delta 400, j["requests"], 40, r.out
      assert_in_delta 0.75, j["targets"][0]["requests"].to_f / j["requests"], 0.08, r.out
      assert_operator j["rate"]["sent"], :>=, j["requests"]
      assert_match(%r{^  Rate: target 200/s, sent \d+, late \d+, dropped \d+$}, r.out)
    end
  end

  def test_non_2xx_counted_per_target
    with_routes do |fx|
      r, j = run_json("-t", "1", "-c", "2", "-d", "500ms", "-P", fx.addr,
                      "--target", "GET /missing", "1", "--target", "GET /fast", "1", fx.url)
      rows = assert_consistent(r, j)
      missing, fast = j["targets"]
      assert_operator missing["requests"], :>, 10
      assert_equal missing["requests"], missing["non_2xx_3xx"]
      assert_equal 0, fast["non_2xx_3xx"]
      assert_equal missing["requests"], j["status_codes"]["404"]
      assert_match(/^  Non-2xx or 3xx responses: #{missing["requests"]}$/, r.out)
      assert_equal missing["requests"], rows["GET /missing"][:non2xx]
    end
  end

  def test_timeouts_counted_against_the_target_that_timed_out
    with_routes do |fx|
      r, j = run_json("-t", "1", "-c", "4", "-d", "1s", "--timeout", "25ms", "-P", fx.addr,
                      "--target", "GET /fast", "1", "--target", "GET /slow", "1", fx.url)
      rows = assert_consistent(r, j)
      fast, slow = j["targets"]
      # every /slow request outlives a 25 ms timeout; /fast ones only if the machine stalls (a CPU hog
      # beside CI stalls it for tens of ms at a time), so fewer of them
      assert_operator slow["errors"]["timeout"], :>=, 10, r.out
      assert_operator fast["errors"]["timeout"], :<, slow["errors"]["timeout"], r.out
      assert_operator fast["requests"], :>, 10, r.out
      assert_equal j["errors"]["timeout"], socket_errors_of(r.out)[3]
      assert_equal slow["errors"]["timeout"], rows["GET /slow"][:errors]
    end
  end

  def test_targets_file_with_comments_and_options_after_it
    Dir.mktmpdir("bl-targets") do |dir|
      file = File.join(dir, "mix.txt")
      File.write(file, "# the mix\n\nGET /fast?page=2 3   # a comment\r\n  POST /form 1\n")
      with_routes do |fx|
        r, j = run_json("-t", "1", "-c", "2", "-d", "500ms", "-P", fx.addr, "--body", "x=1",
                        "--targets", file, "--target", "GET /last", "2", fx.url)
        assert_consistent(r, j)
        assert_equal [["GET", "/fast?page=2", 3], ["POST", "/form", 1], ["GET", "/last", 2]],
                     j["targets"].map { |t| t.values_at("method", "path", "weight") }
        assert_equal ["GET /fast?page=2", "GET /last", "POST /form"], fx.by_target.keys.sort
        assert_equal 0, j["errors"]["read"], r.out
        # -H and --body apply to every target, as without --target
        assert_match(%r{\A(GET|POST) /\S+ HTTP/1\.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nx=1\z}, fx.last_request)
      end
    end
  end

  def test_seed_makes_the_sequence_reproducible
    sequence = lambda do |seed|
      with_routes do |fx|
        r = run_load("-t", "1", "-c", "1", "-d", "300ms", "-P", fx.addr, "--seed", seed,
                     "--target", "GET /a", "1", "--target", "GET /b", "1", "--target", "GET /c", "2", fx.url)
        assert r.success?, r.to_s
        assert_operator fx.sequence.size, :>=, 100, r.out
        fx.sequence.first(100)
      end
    end
    first = sequence.(7)
    assert_equal first, sequence.(7)
    refute_equal first, sequence.(8)
    assert_equal %w[GET\ /a GET\ /b GET\ /c], first.uniq.sort
  end

  def test_without_targets_the_report_is_wrks
    with_routes do |fx|
      r, j = run_json("-t", "1", "-c", "2", "-d", "300ms", "--latency", "-P", fx.addr, "#{fx.url}fast")
      assert_wrk_report(r.out) # ends with wrk's Requests/sec and Transfer/sec lines: nothing after
      refute_match(/Per target/, r.out)
      assert_equal [], j["targets"]
      assert_equal ["GET /fast"], fx.by_target.keys
    end
  end
end
