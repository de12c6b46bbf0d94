# frozen_string_literal: true

require "stringio"
require "tempfile"

module Blackbuck
  # Turns the bytes of a connection into a complete request: head (parsed in C), then the
  # body (Content-Length or chunked, decoded in C) into memory or, past body_buffer bytes,
  # a tempfile. It never calls the worker: #advance answers what the bytes make of the
  # request, and the worker (the connection's one owner, Connections#progress) acts on the answer.
  class Request
    EMPTY = "".b.freeze
    MIN_RATE_GRACE = 10 # seconds a body may take before min_body_rate applies

    # #advance's answers besides a complete request's env (a Hash) and a rejection (an Integer,
    # the status to answer before closing):
    HEAD = :head   # the head is not complete: wait for more of it
    BODY = :body   # the head is in, the body is not: wait for more of it (#bodies holds it so far)
    PROXY_PART = :proxy_part # part of a PROXY header is in: wait for the rest (accept's deadline holds)
    PROXY = :proxy # a PROXY header is in (Conn#parse_proxy): the HTTP request comes next
    DROP = :drop   # not HTTP at all (bytes that are not a PROXY header): close without an answer

    # A request whose body is still arriving: its env, where its body goes so far (a StringIO, or a
    # Tempfile past body_buffer), and when the body began (monotonic seconds; min_body_rate).
    Body = Struct.new(:env, :sink, :started)

    # The tempfile holding the body of the request #advance completed last, or nil: the worker takes
    # it (#take_spilled) and closes it once the app is done with the request.
    attr_reader :spilled

    def initialize(config, logger)
      @logger = logger
      @max_body = config[:max_body]
      @body_buffer = config[:body_buffer]
      @min_body_rate = config[:min_body_rate]
      @empty_input = StringIO.new(EMPTY)
      @spilled = nil
      @bodies = {} # Conn => Body of each connection reading a body (only those: most requests have none)
      # With app threads a request outlives the loop's turn (it runs on another thread): its
      # input is its own, and the worker closes a tempfile body when the app is done with it.
      @threaded = config[:threads] > 1
    end

    # A body arriving slower than min_body_rate (averaged, after a grace period) ties up memory
    # and a connection slot for nothing: the worker answers it 408.
    def too_slow?(conn, t)
      return false unless @min_body_rate.positive? && conn.state == Native::Conn::BODY

      return false unless (body = @bodies[conn])

      elapsed = t - body.started
      elapsed > MIN_RATE_GRACE && body.sink.size < @min_body_rate * elapsed
    end

    # Makes as much progress as the buffered bytes allow and answers what they make: an env, a
    # status to reject with, or one of HEAD, BODY, PROXY_PART, PROXY, DROP. body: the connection is
    # reading a body (Native::Conn::BODY).
    def advance(conn, body)
      return read_body(conn) if body

      env = conn.parse
      case env
      when Hash then start(conn, env)
      when Integer then env
      when false then proxy_header(conn)
      else HEAD
      end
    end

    # The env entry this Request gives every request without a body, for the worker's env templates
    # when it serves one request at a time (no app threads): one empty, read-only rack.input.
    def env_defaults
      @template_input = @empty_input
      { "rack.input" => @empty_input }.freeze
    end

    def take_spilled
      file = @spilled
      @spilled = nil
      file
    end

    # A request that will not be served (rejected, or its client is gone): its body, if one was
    # being read, is thrown away.
    def discard(conn)
      return if @bodies.empty?

      throw_away(@bodies.delete(conn)&.sink)
    end

    private

    # On a proxy_protocol listener a connection starts with the balancer's PROXY header, which names
    # the client (Conn#parse_proxy); bytes that are not a header are dropped. Neither gets an answer
    # (the protocol says so, and what came before a valid header is not HTTP).
    def proxy_header(conn)
      case conn.parse_proxy
      when true then PROXY
      when false then DROP
      else PROXY_PART
      end
    end

    def start(conn, env)
      if conn.body_done?
        # Rack forbids apps to close rack.input; one empty (read-only) input, in the env template
        # (#env_defaults), serves every bodiless request, and a new one replaces it if an app
        # closed it anyway. App threads give each request its own.
        if @threaded
          env["rack.input"] = StringIO.new(EMPTY)
        elsif @template_input.closed?
          @empty_input = StringIO.new(EMPTY) if @empty_input.closed?
          @empty_input.rewind
          env["rack.input"] = @empty_input
        else
          @template_input.rewind
        end
        return env
      end

      length = conn.content_length
      return 413 if @max_body.positive? && length > @max_body

      conn.write_continue if conn.expect_continue? # Connections#progress flushes what the socket did not take
      sink = if length >= 0 && length <= @body_buffer
               StringIO.new(String.new(capacity: length, encoding: Encoding::BINARY))
             elsif length > @body_buffer
               spill_file
             else
               StringIO.new(String.new(encoding: Encoding::BINARY))
             end
      @bodies[conn] = Body.new(env, sink, Process.clock_gettime(Process::CLOCK_MONOTONIC))
      read_body(conn)
    rescue SystemCallError => e # no room for a tempfile
      @logger.error("cannot buffer a request body: #{e.message}")
      503
    end

    def read_body(conn)
      body = @bodies.fetch(conn)
      loop do
        data = conn.body_take
        return data if data.is_a?(Integer)

        unless data.empty?
          sink = body.sink
          return 413 if @max_body.positive? && sink.size + data.bytesize > @max_body

          sink = spill(body) if sink.is_a?(StringIO) && sink.size + data.bytesize > @body_buffer
          sink.write(data)
        end
        return body_complete(conn, body) if conn.body_done?
        return BODY if conn.buffered.zero?
      end
    rescue SystemCallError => e # ENOSPC while spilling
      @logger.error("cannot buffer a request body: #{e.message}")
      throw_away(@bodies.delete(conn)&.sink)
      503
    end

    # A tempfile body nobody will read: closed and gone. Closing flushes the bytes Ruby still buffers
    # for it (a body arriving in pieces under IO's 8 KiB buffer), and on a full disk that flush fails
    # as the writes did: the file is closed all the same, and the error was logged when it happened.
    def throw_away(sink)
      sink.close! if sink.is_a?(Tempfile)
    rescue SystemCallError
      nil
    end

    def body_complete(conn, body)
      env = body.env
      input = body.sink
      input.rewind # (flushes a tempfile: on a full disk this raises, and #read_body throws the body away)
      @bodies.delete(conn)
      env["CONTENT_LENGTH"] = input.size.to_s if conn.chunked?
      env["rack.input"] = input
      @spilled = input if input.is_a?(Tempfile)
      env
    end

    def spill(body)
      file = spill_file
      file.write(body.sink.string)
      body.sink = file
    end

    def spill_file
      file = Tempfile.new("blackbuck-body")
      file.binmode
      file.unlink # no name left behind, even after a crash
      file
    end
  end
end
