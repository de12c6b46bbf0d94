# frozen_string_literal: true

require "socket"
require "json"

module BlackbuckBench
  # The streams workload's stream client (issue 35): no load tool here reads Server-Sent Events, so
  # this one opens N streams over TCP 127.0.0.1 from one process (non-blocking sockets, one
  # IO.select loop), and records for each stream when its first event arrived and whether all its
  # events did. Run as a program by the harness (StreamsStep), beside blackbuck-load on the fast
  # endpoint:
  #
  #   ruby sse_client.rb --port P --streams 1000 --events 30 --interval-ms 100 --ramp 1 --bound 19 --out F.json
  #
  # Method (bench/README.md, "The streams workload"):
  # - Ramp: stream i is due at t0 + ramp_s * i / N (1,000 over 1 s: one a millisecond), opened by a
  #   non-blocking connect when due, so the server's accept backlog (1,024 for every server that
  #   lets us set it) never holds more than what the server itself leaves waiting.
  # - Time to first event is measured from the stream's due time (its intended start), not from
  #   when its connect or request went out: a client that falls behind adds to it, never hides it.
  # - A stream is complete when its status is 200, every event arrived, and the response ended
  #   as its framing says (the last chunk, its Content-Length, or the server's close).
  # - Bounded: at t0 + bound_s every stream still open is closed and counted unfinished.
  # Parsing (Stream) and aggregation (SseClient.summarize) are pure, tested in bench/test.
  module SseClient
    READ_BYTES = 65_536
    MAX_WAIT_S = 0.05 # the loop's longest select: the ramp's next due time or this
    HEAD_LIMIT = 16_384 # a response head larger than this is an error

    # One stream's response, fed the bytes as they arrive. state: :head, :body, :done (complete
    # framing seen) or :failed (error names why). An event is a block ending in a blank line
    # ("\n\n"), as the SSE format has it; only "\n" line ends are written by bench/apps/streams.ru.
    class Stream
      attr_reader :status, :events, :first_event_s, :state, :error, :framing
      attr_accessor :due_s, :ended_s

      def initialize(expected:, due_s: 0.0)
        @expected = expected
        @due_s = due_s
        @state = :head
        @head = +""
        @events = 0
        @first_event_s = nil
        @ended_s = nil
        @error = nil
        @pending = +"" # decoded body bytes not yet ended by a blank line
        @chunk = +""   # chunked framing: undecoded bytes
        @chunk_left = nil # bytes left in the current chunk, nil while reading a size line
      end

      def done? = %i[done failed].include?(@state)

      def complete? = @state == :done && @status == 200 && @events >= @expected

      # Time to first event, seconds from the due time; nil without one.
      def ttfe_s = @first_event_s && (@first_event_s - @due_s)

      # now: the clock (seconds) at which the bytes arrived
      def feed(bytes, now)
        return if done?

        if @state == :head
          @head << bytes
          i = @head.index("\r\n\r\n")
          return fail!("response head over #{HEAD_LIMIT} bytes", now) if i.nil? && @head.bytesize > HEAD_LIMIT
          return if i.nil?

          rest = @head.byteslice(i + 4..)
          parse_head(@head.byteslice(0, i))
          return fail!("status #{@status}", now) unless @status == 200

          @state = :body
          bytes = rest
        end
        case @framing
        when :chunked then dechunk(bytes, now)
        when :length
          take = bytes.byteslice(0, @length_left)
          body(take, now)
          @length_left -= take.bytesize
          finish(now) if @length_left.zero?
        else body(bytes, now)
        end
      end

      # The server closed the connection.
      def eof(now)
        return if done?
        return finish(now) if @state == :body && @framing == :eof

        fail!(@state == :head ? "closed before the response head" : "closed before the end of the #{@framing} body", now)
      end

      def fail!(why, now)
        @error = why
        @state = :failed
        @ended_s = now
        nil
      end

      def to_h
        { "status" => @status, "events" => @events, "ttfe_s" => ttfe_s&.round(6), "complete" => complete?,
          "framing" => @framing&.to_s, "error" => @error,
          "duration_s" => @ended_s && (@ended_s - @due_s).round(6) }
      end

      private

      def parse_head(head)
        lines = head.split("\r\n")
        @status = lines.first.to_s.split(" ")[1].to_i
        headers = lines.drop(1).to_h { |l| k, v = l.split(":", 2); [k.to_s.strip.downcase, v.to_s.strip] }
        if headers["transfer-encoding"].to_s.downcase.include?("chunked")
          @framing = :chunked
        elsif headers["content-length"]
          @framing = :length
          @length_left = headers["content-length"].to_i
        else
          @framing = :eof
        end
      end

      def finish(now)
        @state = :done
        @ended_s = now
        nil
      end

      # Decoded body bytes: count each event (a block ended by a blank line).
      def body(bytes, now)
        @pending << bytes
        while (i = @pending.index("\n\n"))
          @events += 1
          @first_event_s ||= now
          @pending = @pending.byteslice(i + 2..)
        end
        true
      end

      # Transfer-Encoding: chunked: "SIZE[;ext]\r\nDATA\r\n" ... "0\r\n\r\n" (trailers ignored).
      def dechunk(bytes, now)
        @chunk << bytes
        loop do
          if @chunk_left.nil?
            i = @chunk.index("\r\n") or return
            size = @chunk.byteslice(0, i).split(";").first.to_s.strip
            return fail!("bad chunk size #{size[0, 20].inspect}", now) unless size.match?(/\A\h+\z/)

            @chunk = @chunk.byteslice(i + 2..)
            @chunk_left = size.to_i(16)
            return finish(now) if @chunk_left.zero? # the last chunk: the stream ended as it should
          else
            take = [@chunk_left, @chunk.bytesize].min
            body(@chunk.byteslice(0, take), now) if take.positive?
            @chunk = @chunk.byteslice(take..)
            @chunk_left -= take
            return unless @chunk_left.zero? && @chunk.bytesize >= 2

            return fail!("chunk not followed by CRLF", now) unless @chunk.start_with?("\r\n")

            @chunk = @chunk.byteslice(2..)
            @chunk_left = nil
          end
        end
      end
    end

    module_function

    # Nearest-rank percentile of values where nil counts as "never" (larger than any): => a
    # number, or nil when the rank falls on a stream that never had one.
    def percentile(values, pct)
      return nil if values.empty?

      sorted = values.compact.sort
      rank = (pct / 100.0 * values.size).ceil.clamp(1, values.size)
      rank <= sorted.size ? sorted[rank - 1] : nil
    end

    # streams: [Stream#to_h] => the workload's figures. Time to first event over every stream
    # requested, a stream without one counting as later than any (p99 nil = more than 1% had none
    # within the bound).
    def summarize(streams, requested:)
      ttfe = Array.new(requested) { |i| streams[i] && streams[i]["ttfe_s"] }
      ms = ->(s) { s && (s * 1000).round(2) }
      complete = streams.select { |s| s["complete"] }
      errors = streams.reject { |s| s["complete"] }.group_by { |s| s["error"] || "unfinished" }.transform_values(&:size)
      unopened = requested - streams.size
      errors["never opened"] = unopened if unopened.positive?
      {
        "requested" => requested, "completed" => complete.size,
        "with_first_event" => ttfe.compact.size,
        "events" => streams.sum { |s| s["events"].to_i },
        "ttfe_p50_ms" => ms.call(percentile(ttfe, 50)), "ttfe_p99_ms" => ms.call(percentile(ttfe, 99)),
        "ttfe_max_ms" => ms.call(ttfe.compact.max),
        "duration_p50_ms" => ms.call(percentile(complete.map { |s| s["duration_s"] }, 50)),
        "duration_max_ms" => ms.call(complete.map { |s| s["duration_s"] }.max),
        "framing" => streams.map { |s| s["framing"] }.compact.tally,
        "failures" => errors
      }
    end

    # The loop: open each stream when due, read whatever is readable, until every stream is done
    # or the bound passes. => [Stream, ...] in due order.
    def run(port:, streams:, events:, interval_ms:, ramp_s:, bound_s:, host: "127.0.0.1", clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) })
      request = "GET /sse?events=#{events}&interval_ms=#{interval_ms} HTTP/1.1\r\nHost: #{host}:#{port}\r\n" \
                "Accept: text/event-stream\r\nConnection: close\r\n\r\n"
      addr = Socket.sockaddr_in(port, host)
      t0 = clock.call
      all = Array.new(streams) { |i| Stream.new(expected: events, due_s: t0 + ramp_s * i / streams) }
      opened = 0
      reading = {} # socket => Stream
      connecting = {} # socket => Stream (request not written yet)
      loop do
        now = clock.call
        while opened < streams && all[opened].due_s <= now
          s = all[opened]
          opened += 1
          sock = Socket.new(:INET, :STREAM)
          begin
            sock.connect_nonblock(addr)
            connecting[sock] = s # connected at once (loopback): written below when writable
          rescue IO::WaitWritable
            connecting[sock] = s
          rescue SystemCallError => e
            s.fail!("connect: #{e.class.name.split('::').last}", now)
            sock.close
          end
        end
        break if now >= t0 + bound_s
        break if opened == streams && reading.empty? && connecting.empty?

        wait = opened < streams ? all[opened].due_s - now : MAX_WAIT_S
        wait = wait.clamp(0, [MAX_WAIT_S, t0 + bound_s - now].min)
        readable, writable, = IO.select(reading.keys, connecting.keys, nil, wait)
        now = clock.call
        (writable || []).each do |sock|
          s = connecting.delete(sock)
          begin
            err = sock.getsockopt(:SOCKET, :ERROR).int # the connect's outcome
            raise SystemCallError.new("connect", err) unless err.zero?

            sock.write_nonblock(request) # a few dozen bytes into an empty socket buffer: all of it
            reading[sock] = s
          rescue SystemCallError, IOError => e
            s.fail!("connect: #{e.class.name.split('::').last}", now)
            sock.close
          end
        end
        (readable || []).each do |sock|
          s = reading[sock]
          begin
            data = sock.read_nonblock(READ_BYTES, exception: false)
            next if data == :wait_readable

            data.nil? ? s.eof(now) : s.feed(data, now)
          rescue SystemCallError, IOError => e
            s.fail!("read: #{e.class.name.split('::').last}", now)
          end
          next unless s.done?

          reading.delete(sock)
          sock.close
        end
      end
      now = clock.call
      (reading.merge(connecting)).each do |sock, s|
        s.fail!("unfinished at the bound (#{bound_s} s)", now)
        sock.close
      end
      all.first(opened)
    end

    def main(argv)
      require "optparse"
      o = { streams: 1000, events: 30, interval_ms: 100, ramp_s: 1.0, bound_s: 20.0 }
      OptionParser.new do |op|
        op.on("--port N", Integer) { |v| o[:port] = v }
        op.on("--streams N", Integer) { |v| o[:streams] = v }
        op.on("--events N", Integer) { |v| o[:events] = v }
        op.on("--interval-ms N", Integer) { |v| o[:interval_ms] = v }
        op.on("--ramp S", Float) { |v| o[:ramp_s] = v }
        op.on("--bound S", Float) { |v| o[:bound_s] = v }
        op.on("--out PATH") { |v| o[:out] = v }
      end.parse!(argv)
      out = o.delete(:out) or abort("sse_client: --out is required")
      $stdout.puts "ramp" # the harness starts the fast load ramp_s after this line
      $stdout.flush
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      streams = run(**o).map(&:to_h)
      cpu = Process.times.then { |t| t.utime + t.stime }
      File.write(out, JSON.generate("settings" => o.transform_keys(&:to_s), "seconds" => (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).round(3),
                                    "client_cpu_s" => cpu.round(3), "summary" => summarize(streams, requested: o[:streams]),
                                    "streams" => streams))
    end
  end
end

BlackbuckBench::SseClient.main(ARGV) if $PROGRAM_NAME == __FILE__
