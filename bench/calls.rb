# frozen_string_literal: true

# Calls from Ruby into the C extension per keep-alive hello-world request, by method, counted in one
# worker with a TracePoint (:c_call on Blackbuck::Native's classes): the figure docs/ARCHITECTURE.md
# quotes. Every call into C is a method dispatch plus argument checks, and on the hot path they add
# up, so a change to the request path should not add any.
#
#   ruby bench/calls.rb [--requests N] [-- SERVER FLAGS]      e.g. ruby bench/calls.rb -- --threads 2
#
# One worker, one keep-alive client over a UNIX socket sending N requests one after another. The
# app answers GET /__calls with the counts so far; the figure is the difference between two such
# snapshots around the N requests, divided by N (each snapshot request counts about one request's
# calls too, so the figure is high by at most 1/N).
require "json"
require "optparse"
require "socket"
require "tmpdir"

module Calls
  ROOT = File.expand_path("..", __dir__)
  APP = <<~'RU'
    BODY = "hello world\n"
    HEADERS = { "content-type" => "text/plain", "content-length" => BODY.bytesize.to_s }.freeze
    run lambda { |env|
      if env["PATH_INFO"] == "/__calls"
        counts = $blackbuck_calls.dup
        body = JSON.generate(counts)
        [200, { "content-type" => "application/json", "content-length" => body.bytesize.to_s }, [body]]
      else
        [200, HEADERS.dup, [BODY]]
      end
    }
  RU
  CONFIG = <<~'RB'
    require "json"
    after_fork do |_server, _worker|
      $blackbuck_calls = Hash.new(0)
      native = Blackbuck::Native
      owners = native.constants.map { |c| native.const_get(c) }.grep(Module)
      owners += owners.map(&:singleton_class) + [native.singleton_class]
      owners = owners.to_h { |m| [m, true] }
      counts = $blackbuck_calls
      trace = TracePoint.new(:c_call) do |tp|
        owner = tp.defined_class
        counts["#{tp.defined_class.inspect.delete_prefix('#<Class:').delete_suffix('>')}##{tp.method_id}"] += 1 if owners[owner]
      end
      trace.enable
    end
  RB
  READY_SECONDS = 60

  module_function

  def main(argv)
    requests = 2000
    flags = (i = argv.index("--")) ? argv.slice!(i..)[1..] : []
    OptionParser.new do |o|
      o.banner = "usage: ruby bench/calls.rb [--requests N] [-- server flags]"
      o.on("--requests N", Integer, "keep-alive requests counted (default 2000)") { |v| requests = v }
    end.parse!(argv)
    abort "--requests: a positive count" unless requests.positive?
    Dir.mktmpdir("bb-calls") do |tmp|
      File.write(app = File.join(tmp, "hello.ru"), APP)
      File.write(config = File.join(tmp, "calls.rb"), CONFIG)
      sock = File.join(tmp, "s.sock")
      pid = spawn(File.join(ROOT, "exe", "blackbuck"), "-E", "production", "-w", "1", "-c", config,
                  "-l", sock, "--max-keepalive-requests", (requests + 100).to_s, *flags, app, out: File::NULL, err: File.join(tmp, "log"))
      begin
        client = connect(sock, pid, File.join(tmp, "log"))
        20.times { get(client, "/") }
        before = JSON.parse(get(client, "/__calls"))
        requests.times { get(client, "/") }
        after = JSON.parse(get(client, "/__calls"))
        report(before, after, requests, flags)
      rescue EOFError, SystemCallError
        abort "the server closed the connection:\n#{File.read(File.join(tmp, 'log'))}"
      ensure
        Process.kill(:TERM, pid)
        Process.wait(pid)
      end
    end
  end

  def connect(sock, pid, log)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + READY_SECONDS
    loop do
      return UNIXSocket.new(sock)
    rescue Errno::ENOENT, Errno::ECONNREFUSED
      abort "server exited:\n#{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG)
      abort "server not ready after #{READY_SECONDS} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.05
    end
  end

  # One keep-alive request; the body (every answer here has a Content-Length).
  def get(client, path)
    client.write("GET #{path} HTTP/1.1\r\nHost: bench\r\n\r\n")
    head = +""
    head << client.readpartial(1) until head.end_with?("\r\n\r\n")
    length = head[/^content-length: *(\d+)/i, 1].to_i
    body = +""
    body << client.readpartial(length - body.bytesize) while body.bytesize < length
    body
  end

  def report(before, after, requests, flags)
    per = after.to_h { |k, v| [k, (v - before.fetch(k, 0)).fdiv(requests)] }.reject { |_, v| v < 0.005 }
    puts "calls into C per keep-alive request (#{flags.empty? ? 'defaults' : flags.join(' ')}):"
    per.sort_by { |k, v| [-v, k] }.each { |k, v| puts format("  %6.2f  %s", v, k) }
    puts format("  %6.2f  in all", per.values.sum)
  end
end

Calls.main(ARGV) if $PROGRAM_NAME == __FILE__
