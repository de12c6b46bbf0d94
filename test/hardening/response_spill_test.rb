# frozen_string_literal: true

require_relative "../test_helper"
require "digest"
require "json"

# Output a client does not take is queued in memory up to response_buffer, then appended to a
# per-connection spill file in $TMPDIR up to max_response_spill, so a client that stops reading a
# large streamed (or Array) response never holds the worker. Past the caps, or when the file cannot
# be written, the rest is held in memory behind it (BB_OUT_HELD_MAX, 64 MiB for the worker's
# responses together), and past that the response is cut: the worker never waits for the client
# (issue 32, item 18: it used to, up to write_timeout, and every other client waited with it).
# One worker in every test, so a held worker would show as a late fresh request.
HELD_MAX = 64 * 1024 * 1024 # bytes: BB_OUT_HELD_MAX (ext/blackbuck/bb_out.h)
class ResponseSpillHardeningTest < ServerTest
  APP = File.join(__dir__, "apps", "spill.ru")
  PART_BYTES = 64 * 1024 # as in apps/spill.ru
  STREAM_PARTS = 256     # 16 MiB streamed
  ARRAY_PARTS = 512      # 32 MiB Array body

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def test_streamed_each_body_to_a_stalled_reader_spills_and_the_worker_serves_others
    check_stalled_stream("/each?parts=#{STREAM_PARTS}")
  end

  def test_streamed_callable_body_to_a_stalled_reader_spills_and_the_worker_serves_others
    check_stalled_stream("/callable?parts=#{STREAM_PARTS}")
  end

  # The status listener shows what a worker holds in spill files (JSON and Prometheus), and
  # that it goes back to 0 once the client has read everything.
  def test_status_and_metrics_show_spilled_bytes
    stats = File.join(Dir.mktmpdir("bb-stats"), "status.sock")
    server = spill_server(["--write-timeout", "5", "--stats-listen", "unix:#{stats}"])
    io = stalled_request(server, "/each?parts=#{STREAM_PARTS}")
    spilled = wait_for(15) { (n = stats_json(stats)["workers"].first["spill_bytes"]).positive? && n }
    assert_operator spilled, :>, 8 * 1024 * 1024, "most of the 16 MiB body waits in the spill file"
    assert_equal spilled, stats_json(stats)["totals"]["spill_bytes"]
    assert_match(/^blackbuck_spill_bytes\{worker="0"\} [1-9]\d*$/, stats_get(stats, "/metrics"))
    assert_equal STREAM_PARTS * PART_BYTES, read_framed(io)[3]
    wait_for(15) { stats_json(stats)["workers"].first["spill_bytes"].zero? }
    assert_match(/^blackbuck_spill_bytes\{worker="0"\} 0$/, stats_get(stats, "/metrics"))
  ensure
    io&.close
  end

  # The spill file goes away with the connection: a client that never reads is dropped after
  # write_timeout and the worker's descriptors return to what they were before it came.
  def test_non_reader_of_a_spilled_response_is_dropped_and_no_descriptor_is_left
    server = spill_server(["--write-timeout", "1.5"])
    worker = server.worker_pids.first
    assert_fresh_request_served(server, behind: "a stalled reader")
    baseline = wait_for { n = fd_links(worker).size; sleep 0.2; n == fd_links(worker).size && n }

    io = stalled_request(server, "/each?parts=#{STREAM_PARTS}")
    started = now
    wait_for(30) { spill_files(server, worker).size == 1 }
    assert_fresh_request_served(server, behind: "a stalled reader", held: -> { spill_files(server, worker).size == 1 })
    # the stalled client's socket and its spill file (the fresh request's socket closes soon)
    wait_for(30) { fd_links(worker).size == baseline + 2 }

    wait_for(30, "the worker dropping the non-reader and its spill file") { fd_links(worker).size == baseline }
    dropped_at = now - started
    assert_operator dropped_at, :>=, 1.3, "dropped after #{dropped_at.round(2)} s, before the 1.5 s write timeout"
    assert_empty spill_files(server, worker)
    got = read_all(io).bytesize
    assert_operator got, :<, STREAM_PARTS * PART_BYTES, "dropped, so it cannot have the whole body"
    assert_fresh_request_served(server, behind: "a stalled reader")
    assert_equal 1, server.worker_pids.size, "no worker crashed"
  ensure
    io&.close
  end

  # An Array body is handed to the kernel at once; what it does not take past response_buffer goes
  # to the spill file, not to memory, and a slow reader gets every byte.
  def test_large_array_body_to_a_slow_reader_spills_and_the_worker_serves_others
    server = spill_server(["--write-timeout", "5"])
    worker = server.worker_pids.first
    io = stalled_request(server, "/array?parts=#{ARRAY_PARTS}")
    wait_for(15, "a spill file") { spill_files(server, worker).any? } # the reader stalls: the worker queues the rest
    assert_fresh_request_served(server, behind: "a stalled reader", held: -> { spill_files(server, worker).any? })
    assert_equal 1, spill_files(server, worker).size, "the unsent part of the Array body is in a spill file"

    result = nil
    reader = Thread.new { result = read_framed(io, pace: 0.002) }
    assert_fresh_request_served(server, behind: "a slow reader", held: -> { reader.alive? }) # while it still reads
    reader.join(60)
    status, headers, digest, size = result
    assert_equal 200, status
    assert_equal (ARRAY_PARTS * PART_BYTES).to_s, headers["content-length"]
    assert_equal ARRAY_PARTS * PART_BYTES, size
    assert_equal expected_digest(ARRAY_PARTS), digest, "the Array body arrived byte for byte"
    wait_for(15) { spill_files(server, worker).empty? }
    assert_equal 200, request(io, "GET", "/hello")&.status, "the connection is kept alive after it"
  ensure
    reader&.kill
    io&.close
  end

  # max_response_spill 0: nothing is spilled; past response_buffer the rest is held in memory and
  # the worker serves the others at once. Three stalled readers (48 MiB) hold nothing up, and each
  # gets every byte once it reads.
  def test_max_response_spill_zero_holds_the_rest_in_memory_and_the_worker_serves_others
    server = spill_server(["--write-timeout", "20", "--max-response-spill", "0"])
    worker = server.worker_pids.first
    ios = Array.new(3) { stalled_request(server, "/each?parts=#{STREAM_PARTS}") }
    ios.each { |io| assert_fresh_request_served(server, behind: "stalled readers of unspillable responses") }
    assert_empty spill_files(server, worker)
    ios.each do |io|
      status, _, digest, size = read_framed(io)
      assert_equal [200, STREAM_PARTS * PART_BYTES, expected_digest(STREAM_PARTS)], [status, size, digest]
    end
    assert_equal 1, server.worker_pids.size, "no worker crashed"
    refute_match(/cannot spill|fits in no queue/, server.log, "reaching the cap is not a failure worth a warning")
  ensure
    ios&.each(&:close)
  end

  # Past what the worker may hold in memory too, a response is cut (its connection closes, one
  # warning line) rather than the worker waiting for its client.
  def test_past_the_held_memory_a_response_is_cut_and_the_worker_serves_others
    server = spill_server(["--write-timeout", "20", "--max-response-spill", "0"])
    parts = (HELD_MAX / PART_BYTES) + 256 # 16 MiB past it (more than the kernel's socket buffers take)
    io = stalled_request(server, "/array?parts=#{parts}")
    wait_for(15, "the cut") { server.log.match?(/WARN a response to a client that does not take it fits in no queue/) }
    assert_fresh_request_served(server, behind: "a stalled reader past the held memory")
    got = read_all(io, timeout: 30).bytesize
    assert_operator got, :<, parts * PART_BYTES, "the response was cut"
    assert_fresh_request_served(server, behind: "a cut response")
    assert_equal 1, server.worker_pids.size, "no worker crashed"
  ensure
    io&.close
  end

  # A small cap: memory, then 2 MiB of file, then held in memory. The worker serves others at once,
  # and the reader gets every byte, in order.
  def test_past_a_small_max_response_spill_the_rest_is_held_in_order
    server = spill_server(["--write-timeout", "5", "--max-response-spill", (2 * 1024 * 1024).to_s])
    check_held_keeps_bytes(server)
    refute_match(/cannot spill/, server.log)
  end

  # $TMPDIR that does not exist: the spill fails, one warning is logged, and the rest is held in
  # memory; the worker serves the others, and the reader gets every byte.
  def test_spill_failure_holds_the_rest_in_memory_with_one_warning
    dir = Dir.mktmpdir("bb-test")
    server = start_server(["-l", "127.0.0.1:0", "--write-timeout", "5"], app: APP, dir: dir,
                                                                          env: { "TMPDIR" => File.join(dir, "missing") })
    boot = server.log.scan(/WARN response spill files cannot be made in .*/)
    assert_equal 1, boot.size, "the unusable $TMPDIR is reported at boot: #{server.log}"
    assert_match(%r{in #{Regexp.escape(dir)}/missing: No such file or directory}, boot.first)
    check_held_keeps_bytes(server)
    warnings = server.log.scan(/WARN cannot spill a response.*/)
    assert_equal 1, warnings.size, "one warning line for the failed spill: #{warnings.inspect}"
    assert_match(/No such file or directory/, warnings.first)
  end

  # Three pipelined requests from a client that reads nothing at first: the spilled response,
  # then a 103 and a second spilled response (written while the client drains the first), then a
  # small one, all in order.
  def test_pipelined_responses_and_early_hints_behind_a_spilled_response_stay_in_order
    server = spill_server(["--write-timeout", "5", "--early-hints"])
    io = stalled_request(server, "/each?parts=#{STREAM_PARTS}",
                         more: "GET /early-each?parts=#{STREAM_PARTS} HTTP/1.1\r\nHost: x\r\n\r\n" \
                               "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    worker = server.worker_pids.first
    wait_for(30, "a spill file") { spill_files(server, worker).any? }
    assert_fresh_request_served(server, behind: "a stalled reader", held: -> { spill_files(server, worker).any? })
    reader = FramedReader.new(io)
    status, _, digest, = read_framed(io, reader: reader)
    assert_equal [200, expected_digest(STREAM_PARTS)], [status, digest]
    status, headers, = read_framed(io, reader: reader)
    assert_equal 103, status
    assert_equal "</a.css>; rel=preload", headers["link"]
    status, _, digest, = read_framed(io, reader: reader)
    assert_equal [200, expected_digest(STREAM_PARTS)], [status, digest]
    status, _, digest, size = read_framed(io, reader: reader)
    assert_equal [200, 12], [status, size]
    assert_equal Digest::SHA256.hexdigest("hello world\n"), digest
  ensure
    io&.close
  end

  private

  def spill_server(args)
    dir = Dir.mktmpdir("bb-test")
    start_server(["-l", "127.0.0.1:0", *args], app: APP, dir: dir, env: { "TMPDIR" => dir }).tap do |s|
      refute_match(/spill files cannot be made/, s.log, "a usable $TMPDIR gives no boot warning")
    end
  end

  # The stalled client reads nothing until a fresh request has been served beside it, then reads everything.
  def check_stalled_stream(path)
    server = spill_server(["--write-timeout", "5"])
    worker = server.worker_pids.first
    io = stalled_request(server, path)
    wait_for(15, "a spill file") { spill_files(server, worker).any? } # the reader stalls: the worker queues the rest
    assert_fresh_request_served(server, behind: "a stalled reader", held: -> { spill_files(server, worker).any? })
    assert_equal 1, spill_files(server, worker).size, "a spill file in $TMPDIR while the reader stalls"

    status, headers, digest, size = read_framed(io)
    assert_equal 200, status
    assert_equal "chunked", headers["transfer-encoding"]
    assert_equal STREAM_PARTS * PART_BYTES, size
    assert_equal expected_digest(STREAM_PARTS), digest, "the streamed body arrived byte for byte"
    wait_for(15) { spill_files(server, worker).empty? }
    assert_equal 200, request(io, "GET", "/hello")&.status, "the connection is kept alive after it"
  ensure
    io&.close
  end

  # No spill file can take everything, so the rest is held in memory: a fresh request is answered
  # while the client stalls, and the client gets every byte in order.
  def check_held_keeps_bytes(server)
    io = stalled_request(server, "/each?parts=#{STREAM_PARTS}")
    assert_fresh_request_served(server, behind: "a stalled reader whose response is held in memory")
    status, _, digest, size = read_framed(io)
    assert_equal 200, status
    assert_equal STREAM_PARTS * PART_BYTES, size
    assert_equal expected_digest(STREAM_PARTS), digest, "every byte, in order"
    assert_equal 1, server.worker_pids.size, "no worker crashed"
  ensure
    io&.close
  end

  def expected_digest(parts)
    d = Digest::SHA256.new
    parts.times { |i| d << (format("%015d\n", i) * (PART_BYTES / 16)) }
    d.hexdigest
  end

  # A request from a client with a small receive buffer that then reads nothing.
  def stats_get(path, what)
    io = UNIXSocket.new(path)
    io.write("GET #{what} HTTP/1.1\r\nHost: x\r\n\r\n")
    read_response(io).body
  ensure
    io&.close
  end

  def stats_json(path) = JSON.parse(stats_get(path, "/status"))

  # The worker's open files in the server's $TMPDIR (the test server's directory).
  def spill_files(server, pid) = fd_links(pid).select { |l| l.start_with?("#{server.dir}/") && !l.end_with?(".log") }

  # Reads one response with strict framing checks; returns [status, headers, body SHA-256, body size].
  # pace: seconds to sleep after each read (a slow reader).
  def read_framed(io, reader: FramedReader.new(io), pace: 0, timeout: 60)
    reader.pace = pace
    Timeout.timeout(timeout) do
      status = reader.line[%r{\AHTTP/1\.1 (\d{3}) }, 1].to_i
      headers = {}
      while (l = reader.line) != ""
        k, v = l.split(":", 2)
        headers[k.downcase] = v.strip
      end
      digest = Digest::SHA256.new
      size = 0
      if status == 103
        nil
      elsif headers["transfer-encoding"] == "chunked"
        loop do
          size_line = reader.line
          assert_match(/\A\h+\z/, size_line, "a chunk-size line")
          n = size_line.to_i(16)
          if n.zero?
            assert_equal "", reader.line, "the last chunk ends with an empty line (no trailers)"
            break
          end
          digest << reader.take(n)
          size += n
          assert_equal "\r\n", reader.take(2), "CRLF after chunk data"
        end
      else
        left = Integer(headers.fetch("content-length"))
        while left.positive?
          data = reader.take([left, 1 << 20].min)
          digest << data
          size += data.bytesize
          left -= data.bytesize
        end
      end
      [status, headers, digest.hexdigest, size]
    end
  end

  # Buffered reads over a socket without copying the whole buffer for every line.
  class FramedReader
    attr_writer :pace

    def initialize(io)
      @io = io
      @buf = +"".b
      @pos = 0
      @pace = 0
    end

    def line
      until (i = @buf.index("\r\n", @pos))
        fill
      end
      s = @buf.byteslice(@pos, i - @pos)
      @pos = i + 2
      s
    end

    def take(n)
      fill while @buf.bytesize - @pos < n
      s = @buf.byteslice(@pos, n)
      @pos += n
      s
    end

    private

    def fill
      if @pos > (1 << 20)
        @buf = @buf.byteslice(@pos..)
        @pos = 0
      end
      @buf << @io.readpartial(1 << 16)
      sleep @pace if @pace.positive?
    end
  end
end
