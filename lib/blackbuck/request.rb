# frozen_string_literal: true

require "stringio"
require "tempfile"

module Blackbuck
  # Turns the bytes of a connection into a complete request: head (parsed in C), then the
  # body (Content-Length or chunked, decoded in C) into memory or, past body_buffer bytes,
  # a tempfile. Hands the request to the worker only when all of it has arrived, so a slow
  # or short upload never holds the worker.
  class Request
    EMPTY = "".b.freeze
    MIN_RATE_GRACE = 10 # seconds a body may take before min_body_rate applies

    def initialize(worker, config)
      @worker = worker
      @max_body = config[:max_body]
      @body_buffer = config[:body_buffer]
      @header_timeout = config[:header_timeout]
      @body_timeout = config[:body_timeout]
      @min_body_rate = config[:min_body_rate]
      @empty_input = StringIO.new(EMPTY)
      # With app threads a request outlives #serve (it runs on another thread): its input is its
      # own, and the worker closes a tempfile body when the app is done with it.
      @threaded = config[:threads] > 1
    end

    # A body arriving slower than min_body_rate (averaged, after a grace period) ties up memory
    # and a connection slot for nothing: the worker answers it 408.
    def too_slow?(conn, t)
      return false unless @min_body_rate.positive? && conn.state == Worker::BODY

      elapsed = t - conn.body_started
      elapsed > MIN_RATE_GRACE && conn.sink.size < @min_body_rate * elapsed
    end

    # Makes as much progress as the buffered bytes allow. state: the connection's (Conn#state).
    def advance(conn, state)
      return read_body(conn) if state == Worker::BODY

      env = conn.parse
      case env
      when Hash then start(conn, env)
      when Integer then reject(conn, env)
      when false then proxy_header(conn)
      else
        if state == Worker::IDLE && conn.buffered.positive?
          conn.state = Worker::HEAD # the clock for a whole head starts with its first byte
          conn.deadline = @worker.now + @header_timeout
        end
      end
    end

    # Answers a bad request with its status and closes the connection, so nothing the client
    # sent after it is ever executed (in stages, so the client can read the answer).
    def reject(conn, status)
      answered = conn.write_error(status)
      discard_sink(conn)
      answered ? @worker.close(conn) : @worker.drop(conn)
    end

    private

    # On a proxy_protocol listener a connection starts with the balancer's PROXY header, which names
    # the client (Conn#parse_proxy). Until it is in, the connection is IDLE with the deadline accept
    # gave it (Worker::PROXY_HEADER_SECONDS), so no header or half of one is closed quietly when that
    # passes; bytes that are not a header close it at once. Neither gets an answer (the protocol says
    # so, and what came before a valid header is not HTTP). After it, the clock is a new connection's.
    def proxy_header(conn)
      case conn.parse_proxy
      when true
        conn.deadline = @worker.now + @header_timeout
        advance(conn, Worker::IDLE) unless conn.buffered.zero?
      when false then @worker.drop(conn)
      end
    end

    def start(conn, env)
      if conn.body_done?
        # Rack forbids apps to close rack.input; one empty (read-only) input serves every
        # bodiless request, and a new one replaces it if an app closed it anyway.
        if @threaded
          env["rack.input"] = StringIO.new(EMPTY)
        else
          @empty_input = StringIO.new(EMPTY) if @empty_input.closed?
          @empty_input.rewind
          env["rack.input"] = @empty_input
        end
        @worker.serve(conn, env)
        return
      end

      length = conn.content_length
      return reject(conn, 413) if @max_body.positive? && length > @max_body

      if conn.expect_continue?
        conn.write_continue
        @worker.flush_later(conn) if conn.pending_output?
      end
      conn.sink = if length >= 0 && length <= @body_buffer
                    StringIO.new(String.new(capacity: length, encoding: Encoding::BINARY))
                  elsif length > @body_buffer
                    spill_file
                  else
                    StringIO.new(String.new(encoding: Encoding::BINARY))
                  end
      conn.env = env
      conn.state = Worker::BODY
      conn.body_started = @worker.now
      conn.deadline = conn.body_started + @body_timeout
      read_body(conn)
    rescue SystemCallError => e # no room for a tempfile
      @worker.logger.error("cannot buffer a request body: #{e.message}")
      reject(conn, 503)
    end

    def read_body(conn)
      loop do
        data = conn.body_take
        return reject(conn, data) if data.is_a?(Integer)

        unless data.empty?
          sink = conn.sink
          return reject(conn, 413) if @max_body.positive? && sink.size + data.bytesize > @max_body

          sink = spill(conn, sink) if sink.is_a?(StringIO) && sink.size + data.bytesize > @body_buffer
          sink.write(data)
        end
        return body_complete(conn) if conn.body_done?
        break if conn.buffered.zero?
      end
      conn.deadline = @worker.now + @body_timeout
    rescue SystemCallError => e # ENOSPC while spilling
      @worker.logger.error("cannot buffer a request body: #{e.message}")
      reject(conn, 503)
    end

    def body_complete(conn)
      env = conn.env
      input = conn.sink
      input.rewind
      env["CONTENT_LENGTH"] = input.size.to_s if conn.chunked?
      env["rack.input"] = input
      conn.env = nil
      conn.sink = nil
      @worker.serve(conn, env)
    ensure
      input.close! if input.is_a?(Tempfile) && !@threaded
    end

    def spill(conn, sink)
      file = spill_file
      file.write(sink.string)
      conn.sink = file
    end

    def spill_file
      file = Tempfile.new("blackbuck-body")
      file.binmode
      file.unlink # no name left behind, even after a crash
      file
    end

    def discard_sink(conn)
      sink = conn.sink
      sink.close! if sink.is_a?(Tempfile)
      conn.sink = nil
      conn.env = nil
    end
  end
end
