# frozen_string_literal: true

require "socket"
require_relative "../errors"
require_relative "file_redirect"
require_relative "hijacked"

module Blackbuck
  # Calls the app and writes its answer. The framing rules live in C (Conn#write_response):
  # an Array body goes out in one writev with Content-Length; a body that names its file
  # (`to_path`) is sent from that file with sendfile(2) (Conn#write_file); an `each` body is
  # streamed, chunked on HTTP/1.1 when the app gave no length; a Rack 3 callable body gets a
  # stream. It never decides the connection's fate: #handle answers what happened, and the worker
  # (the connection's one owner) acts on it.
  class Response
    RESPONSE_FINISHED = "rack.response_finished"
    HIJACK = "rack.hijack"
    EARLY_HINTS = "rack.early_hints"
    CLOSED = Class.new(StandardError) # the client went away mid-body
    InvalidBody = Class.new(TypeError) # not a Rack body (a String, nil): answered 500 before anything is sent
    InvalidResponse = Class.new(TypeError) # not [status, headers, body], or a status out of 100..999: likewise
    STATUSES = (100..999).freeze # what a response's status may be (three digits, RFC 9110 section 15)

    # What #handle answers:
    DONE = :done         # the whole response is sent
    WRITTEN = :written   # the response is written, part of it maybe queued for the client
    HIJACKED = :hijacked # the app took the socket (rack.hijack)
    CLOSE = :close       # the answer is complete (an error status) or cut short: close in stages
    DROP = :drop         # the client is gone: close at once
    STREAMING = :streaming # the body waits on a stream's fiber (Streams): the connection is STREAM until it ends
    # As WRITTEN / CLOSE / DROP, and the worker is replaced (it retires once the connection is seen to):
    # a request timeout was raised in the app (whether or not the app rescued it: Rails' ShowExceptions
    # does, and answers itself), or the app raised an exception after which the process is not to be
    # trusted (UNSAFE).
    RETIRE_WRITTEN = :retire_written
    RETIRE_CLOSE = :retire_close
    RETIRE_DROP = :retire_drop
    RETIRE_STREAMING = :retire_streaming # as STREAMING, and the worker is replaced now (its streams end with its stop)
    RETIRE = { DONE => RETIRE_WRITTEN, WRITTEN => RETIRE_WRITTEN, CLOSE => RETIRE_CLOSE, DROP => RETIRE_DROP,
               HIJACKED => HIJACKED, STREAMING => RETIRE_STREAMING }.freeze # (a RETIRE_ one stays as it is)
    # Exceptions outside StandardError that are answered 500 (as every app error is) and then replace
    # the worker: memory ran out, the app called `exit` or raised a signal's exception (it meant the
    # process to end). Others (Exception itself, SecurityError) are answered 500 and the worker serves on.
    UNSAFE = [NoMemoryError, SystemExit, SignalException].freeze

    # What an app thread's Response answers (in place of a mode) for a streamed body with the streams
    # setting: the body, not iterated yet, for the loop's Response to run on a stream's fiber
    # (#take_stream; AppRunner::Threads#finished). finished: the request's rack.response_finished
    # callbacks, run when the stream ends. retire: the app rescued a request timeout's notice (the
    # worker is replaced, as after any such response).
    Handed = Struct.new(:env, :status, :headers, :body, :finished, :retire)

    # hand_over: called with the connection when the app hijacks it, before the app gets the socket
    # (the worker must stop watching it then: the app may close it at once); nil when nothing
    # watches it while the app runs (app threads). streams: the worker's Streams (the streams setting;
    # the loop's own Response): a streamed body runs on a fiber of its own. nil: here, as it always
    # did, or, with the streams setting (an app thread's Response), it is handed to the loop (Handed).
    def initialize(config, app, logger, hand_over, streams: nil)
      @app = app
      @streams = streams
      @hand_streams = !streams && config[:streams] ? true : false
      @hooks = ConnHooks.new(hand_over)
      @logger = logger
      @timeout = config[:timeout]
      @early_hints = config[:early_hints] # offer rack.early_hints (off: most proxies cannot pass a 103 on)
      @file_redirect = FileRedirect.for(config) # X-Sendfile / X-Accel-Redirect, when configured
      @finished = nil
    end

    # The env entries this Response gives every request, for the worker's env templates when one
    # Response serves the worker's requests one at a time (no app threads): then a request's env has
    # them from the start (C copies the template) and #handle sets none of them. rack.early_hints is
    # offered only with the early_hints setting, and only to HTTP/1.1 requests (C takes it out of an
    # HTTP/1.0 request's env); rack.response_finished is one Array, emptied after each request's
    # callbacks ran.
    def env_defaults
      @finished = []
      defaults = { HIJACK => @hooks, RESPONSE_FINISHED => @finished }
      defaults[EARLY_HINTS] = @hooks.early_hints if @early_hints
      defaults.freeze
    end

    # The master's request-timeout notice for the request this Response runs (AppRunner raises it in
    # the app). Kept so #handle knows, once the app has returned, whether it was raised (it has a
    # backtrace then) even when the app rescued it and answered itself.
    def timeout_notice(limit)
      @notice = RequestTimeout.new("request ran longer than #{limit}s")
    end

    # Runs the app for one request and writes its answer: the mode (DONE ... RETIRE_DROP).
    def handle(conn, env)
      @retire = false
      @notice = nil
      path = env["PATH_INFO"] # (as the request came: Rails 6.1's ShowExceptions rewrites it to "/503")
      mode = answer(conn, env)
      if @notice&.backtrace # raised in the app, and the app rescued it: the backtrace says where it ran
        @logger.exception("request timeout (#{@timeout}s), rescued by the app: #{env['REQUEST_METHOD']} #{path}", @notice)
        @retire = true
      end
      return RETIRE.fetch(mode, mode) if @retire && !mode.is_a?(Handed)

      mode.retire = @retire if mode.is_a?(Handed)
      mode
    ensure
      @notice = nil
      @retire = false # (a stream's end reads it: Response#finish_later)
    end

    # The loop's Response runs a streamed body an app thread handed over (Handed), on a stream's
    # fiber: the mode, STREAMING while it waits (its end closes the body and runs the callbacks), as
    # #handle's for a body that runs here.
    def take_stream(conn, handed)
      env = handed.env
      @retire = handed.retire
      hooks = @hooks
      hooks.start(conn, env)
      body = handed.body
      finished = handed.finished
      mode = @streams.start(conn, env) { stream(conn, env, handed.status, handed.headers, body, hooks) }
      if mode == STREAMING
        finish_later(conn, env, handed.status, handed.headers, body, finished)
        body = finished = nil # (the stream's end closes it and runs them)
      end
      @retire ? RETIRE.fetch(mode, mode) : mode
    ensure
      close_body(body) if body.respond_to?(:close)
      run_finished(finished, env, handed.status, handed.headers, nil) unless finished.nil? || finished.empty?
      @retire = false
    end

    private

    def answer(conn, env)
      hooks = @hooks
      hooks.start(conn, env)
      unless (finished = @finished) # app threads: each request its own
        finished = env[RESPONSE_FINISHED] = []
        env[HIJACK] = hooks
        env[EARLY_HINTS] = hooks.early_hints if @early_hints && env["SERVER_PROTOCOL"] == "HTTP/1.1"
      end
      status = headers = body = error = nil
      begin
        status, headers, body = response = @app.call(env)
      rescue RequestTimeout => e
        error = e
        timed_out(e, "request timeout (#{@timeout}s): #{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
        return answer_error(conn, 503, hooks)
      rescue Exception => e # rubocop:disable Lint/RescueException -- any app error is a 500, not a lost worker
        error = e
        app_error("app error: #{env['REQUEST_METHOD']} #{env['PATH_INFO']}", e)
        return answer_error(conn, 500, hooks)
      end
      return HIJACKED if hooks.hijacked?
      return invalid_response(conn, env, response, hooks) unless triple?(response)

      mode = write(conn, env, status, headers, body, hooks)
      if mode.is_a?(Handed) # (an app thread's, with the streams setting: the loop runs the body)
        mode.finished = finished
        body = finished = nil
        return mode
      end
      return mode unless mode == STREAMING

      finish_later(conn, env, status, headers, body, finished)
      body = finished = nil # (the stream's end closes it and runs them, not #ensure)
      STREAMING
    rescue RequestTimeout => e
      error = e
      timed_out(e, "request timeout (#{@timeout}s) while writing: #{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
      CLOSE # the response is cut short: the client sees it end early
    ensure
      close_body(body) if body.respond_to?(:close)
      run_finished(finished, env, status, headers, error) unless finished.nil? || finished.empty?
    end

    # The body waits on its stream's fiber (Streams): it is closed and the rack.response_finished
    # callbacks run when the stream ends, and its mode becomes a RETIRE one if its end replaces the
    # worker (a request timeout in a run of the fiber). The callbacks are taken out of the Array the
    # worker's env templates share, into one of the stream's own that its env holds from now on: the
    # next request's start empty, and a callback the body adds while it streams
    # (`env["rack.response_finished"] << cb`) runs when this stream ends, not with a later request's.
    # (A body that kept the Array itself from app.call adds to the shared one: it runs with the next
    # request's.)
    def finish_later(conn, env, status, headers, body, finished)
      callbacks = finished.dup
      finished.clear
      env[RESPONSE_FINISHED] = callbacks if env[RESPONSE_FINISHED].equal?(finished)
      @streams.ends_with(conn) do |mode|
        close_body(body) if body.respond_to?(:close)
        run_finished(callbacks, env, status, headers, nil) unless callbacks.empty?
        mode = RETIRE.fetch(mode, mode) if @retire
        @retire = false
        mode
      end
    end

    # A request timeout that came back here: logged with its backtrace, and the worker is replaced.
    def timed_out(err, what)
      @notice = nil # (#handle: not the app's to rescue)
      @retire = true
      @logger.exception(what, err)
    end

    # An app error, logged with its backtrace; one of UNSAFE replaces the worker once it is answered.
    def app_error(what, err)
      if UNSAFE.any? { |k| err.is_a?(k) }
        @retire = true
        what = "#{what} (the worker is replaced after this request)"
      end
      @logger.exception(what, err)
    end

    def write(conn, env, status, headers, body, hooks)
      status = status_code(status)
      raise TypeError, "response headers must be a Hash, got #{headers.class}" unless headers.is_a?(Hash)

      if (partial = headers[HIJACK])
        conn.write_response(status, headers, nil, true)
        partial.call(hooks.call)
        return HIJACKED
      end

      if (target = @file_redirect&.resolve(headers))
        mode = write_redirect(conn, env, target)
        return answer_error(conn, 500, hooks) unless mode
      elsif (parts = array_parts(body))
        mode = conn.write_response(status, headers, parts, false)
      elsif !(mode = write_file_body(conn, status, headers, body))
        unless body.respond_to?(:each) || body.respond_to?(:call)
          raise InvalidBody, "app returned #{body.nil? ? 'a nil' : "a #{body.class}"} body; a Rack body responds to each or call"
        end
        # A streamed body: on a fiber of its own with the streams setting (Streams: STREAMING when it
        # waits; from an app thread, the loop runs it: Handed), else here.
        return Handed.new(env, status, headers, body) if @hand_streams
        return stream(conn, env, status, headers, body, hooks) unless (streams = @streams)

        return streams.start(conn, env) { stream(conn, env, status, headers, body, hooks) }
      end
      return DROP if mode == Native::Conn::WRITE_FAILED

      # DONE: all of it is out; WRITTEN: some may wait in the output queue for the client
      mode == Native::Conn::WRITE_DONE ? DONE : WRITTEN
    rescue CLOSED
      DROP
    rescue RequestTimeout => e
      timed_out(e, "request timeout (#{@timeout}s) before the body's first part: #{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
      answer_error(conn, 503, hooks)
    rescue Exception => e # rubocop:disable Lint/RescueException -- the body is the app's code too (#answer)
      body_failed(conn, env, hooks, nil, e)
    end

    # An `each` or callable body, written part by part (on a stream's fiber with the streams setting:
    # then a wait suspends only the fiber). The mode, as #write's.
    def stream(conn, env, status, headers, body, hooks)
      stage = nil # how far the body got (#stream_each): what a failure can still answer
      if body.respond_to?(:each) && !bodiless?(env, status)
        mode = stream_each(conn, status, headers, body) { |reached| stage = reached }
      else
        mode = conn.write_response(status, headers, nil, false)
        if streaming?(mode)
          stage = :sent
          mode = stream_call(conn, body, mode == Native::Conn::STREAM_CHUNKED)
        end
      end
      return DROP if mode == Native::Conn::WRITE_FAILED

      # DONE: all of it is out; WRITTEN: some may wait in the output queue for the client
      stage == :sent || mode != Native::Conn::WRITE_DONE ? WRITTEN : DONE
    rescue CLOSED
      DROP
    rescue RequestTimeout => e
      what = "#{env['REQUEST_METHOD']} #{env['PATH_INFO']}"
      if %i[head sent].include?(stage) # the head is out: the response can only be cut short
        timed_out(e, "request timeout (#{@timeout}s) while writing: #{what}")
        return CLOSE
      end
      timed_out(e, "request timeout (#{@timeout}s) before the body's first part: #{what}")
      answer_error(conn, 503, hooks)
    rescue Exception => e # rubocop:disable Lint/RescueException -- the body is the app's code too (#answer)
      body_failed(conn, env, hooks, stage, e)
    end

    # Nothing was written when write_response raised (it validates first), nor when an `each` body
    # failed before its first part: answer 500. Once a streamed body has begun, its status is out;
    # the only honest signal left is to end the connection without the final chunk (or short of
    # Content-Length), so the client sees a truncated body, never a second response spliced into
    # the first. stage: how far a streamed body got (#stream_each), nil for any other.
    def body_failed(conn, env, hooks, stage, err)
      request = "#{env['REQUEST_METHOD']} #{env['PATH_INFO']}"
      case stage
      when :sent
        app_error("body failed after the head was sent, connection closed: #{request}", err)
        return CLOSE
      when :each then app_error("body failed before its first part: #{request}", err)
      else
        if err.is_a?(InvalidBody) || err.is_a?(InvalidResponse)
          @logger.error("#{err.message}: #{request}")
        else
          app_error("invalid response: #{request}", err)
        end
      end
      answer_error(conn, 500, hooks)
    end

    # What the app returned is [status, headers, body] (an Array of three, or what converts to one).
    def triple?(response) = response.is_a?(Array) ? response.size == 3 : response.respond_to?(:to_ary)

    # Anything else (`[200, {}]`, a String): a 500, and the log says what came back.
    def invalid_response(conn, env, response, hooks)
      what = response.is_a?(Array) ? "an Array of #{response.size}" : "a #{response.class}"
      @logger.error("app returned #{what}, not [status, headers, body]: #{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
      answer_error(conn, 500, hooks)
    end

    # The response's status as an Integer (200 or "200"), else InvalidResponse naming it.
    def status_code(status)
      code = status.is_a?(Integer) ? status : Integer(status, exception: false)
      return code if code && STATUSES.cover?(code)

      raise InvalidResponse, "app returned status #{status.inspect}; a Rack status is an integer #{STATUSES}"
    end

    # Conn#write_response sent (or queued) the head, and the body is the caller's to write, chunked
    # or as it is. Each mode is named: the write modes are answers, not an ordered scale.
    def streaming?(mode) = mode == Native::Conn::STREAM_CHUNKED || mode == Native::Conn::STREAM_RAW

    # A response that never has a body: Conn#write_response sends its head alone (the same rule in
    # C), and its `each` body is not iterated.
    def bodiless?(env, status) = status < 200 || status == 204 || status == 304 || env["REQUEST_METHOD"] == "HEAD"

    # The body as an Array when it is one or converts to one. `to_ary` may answer nil, Ruby's
    # "not convertible" (Rails 6.1's response body does): such a body is streamed with `each`.
    def array_parts(body)
      return body if body.is_a?(Array)
      return nil unless body.respond_to?(:to_ary)

      parts = body.to_ary
      parts.is_a?(Array) ? parts : nil
    end

    # A body that names its file (Rack::Files, Rails' send_file, a Tempfile) goes out from that file
    # with sendfile(2) when the response allows (Conn#write_file: a 200 without Transfer-Encoding or
    # another Content-Length; opened before the body is closed): the write mode, or nil to stream
    # the body with `each` instead (a 206 range, a path that is not a regular file).
    def write_file_body(conn, status, headers, body)
      return nil unless body.respond_to?(:to_path)

      path = body.to_path
      # Rails' send_file(Rails.root.join(...)) answers the Pathname it was given
      path = path.to_path if !path.is_a?(String) && path.respond_to?(:to_path)
      path.is_a?(String) ? conn.write_file(status, headers, path) : nil
    end

    NOT_FOUND_HEADERS = { "content-type" => "text/plain" }.freeze
    NOT_FOUND_BODY = ["Not Found\n"].freeze

    # X-Sendfile / X-Accel-Redirect (FileRedirect): the named file replaces the app's body, as a
    # 200 with the file's Content-Length. A file that is missing, unreadable or not a regular file
    # is a 404 (what nginx answers for a missing X-Accel-Redirect target). Returns the write mode,
    # or nil when the header was refused or the file could not be opened for another reason
    # (EMFILE...): the caller answers 500. Each refusal, 404 or 500 is one log line.
    def write_redirect(conn, env, target)
      if target.is_a?(FileRedirect::Refused)
        @logger.error("#{target.reason}: #{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
        return nil
      end
      mode = conn.write_file(200, target.headers, target.path)
      return mode if mode

      status, why = FileRedirect.unusable(target.path)
      @logger.error("#{target.via} #{target.path}: #{why}: #{status} for #{env['REQUEST_METHOD']} #{env['PATH_INFO']}")
      conn.write_response(404, NOT_FOUND_HEADERS, NOT_FOUND_BODY, false) if status == 404
    end

    # An `each` body's head goes out with its first part (or, when it yields none, once `each` has
    # returned), so a body that fails before its first part is still answered 500: nothing of it was
    # sent. Yields how far it got: :each (the body runs, nothing sent), :head (the head is being
    # written), :sent (the head is out). The write mode (WRITE_FAILED: the client is gone). On a
    # stream's fiber (@streams): a part past the high-water mark waits for the client (Streams#wrote),
    # a body that waits before its first part sends its head when it first waits (a client's
    # EventSource opens, a proxy's idle timer restarts: Streams#on_first_wait; a failure after that
    # can only cut the body), and a stop (StreamStop, raised where the body waits) ends the body: the
    # head if it was not out, then the last chunk.
    def stream_each(conn, status, headers, body)
      mode = nil
      head = lambda do
        yield :head
        mode = conn.write_response(status, headers, nil, false)
        yield :sent
        streaming?(mode)
      end
      # true when the head is out (sent now if it was not) and the body's parts may follow it
      body_follows = -> { mode.nil? ? head.call : streaming?(mode) }
      yield :each
      streams = @streams
      streams&.on_first_wait(conn) do
        head.call if mode.nil?
      rescue StandardError
        nil # (headers write_response refuses: nothing was sent, and the first part meets it again)
      end
      begin
        body.each do |part|
          return mode unless body_follows.call

          conn.write_part(part, mode == Native::Conn::STREAM_CHUNKED) || raise(CLOSED)
          streams&.wrote(conn)
        end
      rescue StreamStop
        raise unless streams
      end
      return mode unless body_follows.call

      conn.finish_body(mode == Native::Conn::STREAM_CHUNKED) || raise(CLOSED)
      Native::Conn::WRITE_DONE
    end

    # A Rack 3 callable body: its head is out already, the app writes the body to a stream. A stop
    # ends it as it ends an `each` body (#stream_each).
    def stream_call(conn, body, chunked)
      out = Stream.new(conn, chunked, @streams)
      begin
        body.call(out)
      rescue StreamStop
        raise unless @streams
      end
      out.close
      conn.finish_body(chunked) || raise(CLOSED)
      Native::Conn::WRITE_DONE
    end

    def answer_error(conn, status, hooks)
      return HIJACKED if hooks.hijacked?

      !conn.closed? && conn.write_error(status) ? CLOSE : DROP
    end

    def close_body(body)
      body.close
    rescue RequestTimeout => e
      timed_out(e, "request timeout (#{@timeout}s) in body.close")
    rescue Exception => e # rubocop:disable Lint/RescueException -- the app's code (#answer)
      app_error("body.close", e)
    end

    def run_finished(finished, env, status, headers, error)
      finished.each do |cb|
        cb.call(env, status, headers, error)
      rescue RequestTimeout => e
        timed_out(e, "request timeout (#{@timeout}s) in a rack.response_finished callback")
      rescue Exception => e # rubocop:disable Lint/RescueException -- the app's code (#answer)
        app_error("rack.response_finished callback", e)
      end
    ensure
      finished.clear
    end

    # The stream handed to a Rack 3 callable body: writes go out framed (chunked when needed).
    # streams: the worker's Streams when the body runs on a stream's fiber (a write past the
    # high-water mark waits for the client there), else nil.
    class Stream
      def initialize(conn, chunked, streams = nil)
        @conn = conn
        @chunked = chunked
        @streams = streams
        @closed = false
      end

      def write(data)
        raise IOError, "stream closed" if @closed

        data = data.to_s
        @conn.write_part(data, @chunked) || raise(CLOSED)
        @streams&.wrote(@conn)
        data.bytesize
      end

      def <<(data)
        write(data)
        self
      end

      def flush = self
      def read(*) = nil
      def close_read = nil
      def close_write = (@closed = true)
      def close = (@closed = true)
      def closed? = @closed
    end

    # The rack.hijack and rack.early_hints callables. A Response runs one request at a time,
    # so one object per Response serves them all, pointed at the current request by #start.
    class ConnHooks
      def initialize(hand_over)
        @hand_over = hand_over
        @hijacked = false
        @io = nil
      end

      def start(conn, env)
        @conn = conn
        @env = env
        @hijacked = false
        @io = nil
      end

      def hijacked? = @hijacked

      # rack.hijack: the app takes the socket; the worker stops watching it first (hand_over).
      def call
        return @io if @hijacked

        @hand_over&.call(@conn)
        fd = @conn.detach
        @io = @conn.tcp? ? TCPSocket.for_fd(fd) : UNIXSocket.for_fd(fd)
        @io.autoclose = true
        Hijacked.add(@io) # (a mold forked from this worker closes its copy)
        @hijacked = true
        @env["rack.hijack_io"] = @io if @env
        @io
      end

      # rack.early_hints: a 103 response; names and values are validated like any response
      # header (an invalid one raises ArgumentError in the app).
      def early_hints
        @early_hints ||= ->(headers) { @conn.write_hints(headers) }
      end
    end
  end
end
