# frozen_string_literal: true

require_relative "../test_helper"

# Issue 32: an app exception outside StandardError (Exception itself, NoMemoryError, `exit`,
# Interrupt, SignalException, SecurityError) crashed the worker: no answer, and every other
# connection of the worker reset. Each is a 500 with its backtrace logged now; after those that mean
# the process is not to be trusted (Response::UNSAFE) the worker is replaced once it has answered.
# And a request timeout the app rescues itself (as Rails' ShowExceptions does) is logged with its
# backtrace and replaces the worker: it was interrupted anywhere.
class AppExceptionsTest < ServerTest
  APP = <<~'RU'
    KINDS = {
      "exception" => -> { raise Exception, "a plain Exception" },
      "security" => -> { raise SecurityError, "not allowed" },
      "nomemory" => -> { raise NoMemoryError, "out of memory (pretend)" },
      "exit" => -> { exit 3 },
      "interrupt" => -> { raise Interrupt },
      "signal" => -> { raise SignalException, "TERM" }
    }.freeze
    # An `each` body that fails before its first part: still answered 500.
    FailingBody = Struct.new(:kind) do
      def each = KINDS.fetch(kind).call
    end

    run lambda { |env|
      case env["PATH_INFO"]
      when "/pid" then [200, {}, [Process.pid.to_s]]
      when %r{\A/raise/(\w+)\z} then KINDS.fetch($1).call
      when %r{\A/body/(\w+)\z} then [200, {}, FailingBody.new($1)]
      when "/rescue-timeout" # rescues everything, as Rails' ShowExceptions does, and answers itself
        begin
          sleep 30
          [200, {}, ["slept"]]
        rescue Exception => e # rubocop:disable Lint/RescueException
          [500, { "content-type" => "text/plain" }, ["rescued #{e.class}"]]
        end
      else [200, {}, ["hello"]]
      end
    }
  RU

  MESSAGES = {
    "exception" => "Exception: a plain Exception", "security" => "SecurityError: not allowed",
    "nomemory" => "NoMemoryError: out of memory (pretend)", "exit" => "SystemExit: exit",
    "interrupt" => "Interrupt: Interrupt", "signal" => "SignalException: SIGTERM"
  }.freeze

  def start(args = [])
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/exceptions.ru", APP)
    start_server(["-l", "127.0.0.1:0", *args], app: "#{dir}/exceptions.ru", dir: dir)
  end

  def pid_of(io) = Integer(request(io, "GET", "/pid").body)

  # Exception and SecurityError: a 500, the backtrace into the app, and the worker serves on, its
  # other connections with it (an idle keep-alive connection opened before answers after).
  def test_exception_and_security_error_are_500_and_the_worker_serves_on
    server = start
    idle = server.tcp
    pid = pid_of(idle)
    %w[raise body].each do |where|
      %w[exception security].each do |kind|
        io = server.tcp
        res = request(io, "GET", "/#{where}/#{kind}")
        assert_equal 500, res&.status, "#{where}/#{kind}:\n#{server.log}"
        io.close
        assert_logged(server, %r{ERROR .*GET /#{where}/#{kind}: #{Regexp.escape(MESSAGES[kind])}\n\s+.*exceptions\.ru:\d+})
      end
    end
    assert_equal pid, pid_of(idle), "the same worker answers on the idle keep-alive connection"
    refute_match(/replaced after this request/, server.log)
  ensure
    idle&.close
  end

  # NoMemoryError, `exit`, Interrupt, SignalException: a 500 with the backtrace, and then a fresh
  # worker replaces the one that raised it.
  def test_unsafe_exceptions_are_500_then_the_worker_is_replaced
    stats = "#{Dir.mktmpdir('bb-test')}/status.sock"
    server = start(["--stats-listen", "unix:#{stats}"])
    { "raise" => %w[nomemory exit], "body" => %w[interrupt signal] }.each do |where, kinds|
      kinds.each do |kind|
        io = server.tcp
        pid = pid_of(io)
        res = request(io, "GET", "/#{where}/#{kind}")
        assert_equal [500, "close"], [res&.status, res&.[]("connection")], "#{where}/#{kind}:\n#{server.log}"
        io.close
        assert_logged(server, %r{ERROR .*GET /#{where}/#{kind} \(the worker is replaced after this request\): #{Regexp.escape(MESSAGES[kind])}\n\s+.*exceptions\.ru:\d+})
        wait_for(30, "worker #{pid} replaced after #{kind}") { !alive?(pid) && server.worker_pids.size > 1 }
        io = server.tcp
        refute_equal pid, pid_of(io), "a new worker answers"
        io.close
      end
    end
    # /status counts them as replaced for being unsafe (WorkerExits)
    exits = wait_for(30, "4 unsafe exits in /status") do
      sock = UNIXSocket.new(stats)
      e = JSON.parse(request(sock, "GET", "/status").body)["worker_exits"]
      sock.close
      e["unsafe"] == 4 && e
    end
    assert_equal 0, exits.except("unsafe").values.sum, exits.inspect
  end

  # The app rescues the request timeout and answers itself (Rails does): its answer goes out, the
  # log has the timeout's backtrace (where the app was when it came), and the worker is replaced.
  def test_a_timeout_the_app_rescues_is_logged_and_replaces_the_worker
    server = start(["-t", "1"])
    io = server.tcp
    pid = pid_of(io)
    res = request(io, "GET", "/rescue-timeout")
    assert_equal [500, "rescued Blackbuck::RequestTimeout"], [res&.status, res&.body]
    assert_logged(server, %r{request timeout \(1s\), rescued by the app: GET /rescue-timeout: Blackbuck::RequestTimeout: request ran longer than 1s\n(\s+\S+:in .*\n)*?\s+\S*exceptions\.ru:\d+:in .*sleep})
    wait_for(30, "worker #{pid} replaced after the timeout") { !alive?(pid) }
    io2 = server.tcp
    refute_equal pid, pid_of(io2)
  ensure
    io&.close
    io2&.close
  end
end
