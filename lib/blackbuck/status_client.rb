# frozen_string_literal: true

require "json"
require "optparse"
require "socket"
require_relative "errors"
require_relative "listeners"

module Blackbuck
  # `blackbuck status [--json] ADDR`: fetches GET /status from a master's --stats-listen
  # address and prints it as a table (or the raw JSON). Exit 0 on success, 1 when the
  # address does not answer, 2 for usage mistakes; every error is one line on stderr.
  class StatusClient
    TIMEOUT = 5 # seconds for connect + answer

    def initialize(argv, out: $stdout, err: $stderr)
      @argv = argv.dup
      @out = out
      @err = err
      @json = false
    end

    def run
      rest = OptionParser.new do |o|
        o.banner = "Usage: blackbuck status [--json] ADDR (HOST:PORT or unix:/path, as given to --stats-listen)"
        o.on("--json", "print the raw JSON") { @json = true }
      end.parse(@argv)
      raise OptionParser::InvalidArgument, "want exactly one ADDR" unless rest.size == 1

      addr = rest.first
      body = fetch(addr)
      if @json
        @out.puts body
      else
        @out.print table(JSON.parse(body))
      end
      0
    rescue OptionParser::ParseError => e
      @err.puts "blackbuck status: #{e.message}"
      2
    rescue ConfigError => e
      @err.puts "blackbuck status: #{e.message}"
      1
    rescue SystemCallError, IOError, SocketError, JSON::ParserError => e
      @err.puts "blackbuck status: cannot read status from #{addr}: #{e.message}"
      1
    end

    private

    def fetch(addr)
      kind, host, where = Listeners.parse(addr)
      sock = if kind == :unix
               Socket.unix(where)
             else
               Socket.tcp(host == "0.0.0.0" ? "127.0.0.1" : host, where, connect_timeout: TIMEOUT)
             end
      sock.write("GET /status HTTP/1.1\r\nHost: blackbuck\r\nConnection: close\r\n\r\n")
      raw = +""
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + TIMEOUT
      loop do
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise IOError, "no answer within #{TIMEOUT}s" if left <= 0

        chunk = sock.read_nonblock(65_536, exception: false)
        case chunk
        when :wait_readable then sock.wait_readable(left)
        when nil then break
        else raw << chunk
        end
      end
      head, body = raw.split("\r\n\r\n", 2)
      status = head.to_s[%r{\AHTTP/1\.[01] (\d{3})}, 1]
      raise IOError, "unexpected answer #{head.to_s.lines.first.inspect}" unless status == "200"

      body
    ensure
      sock&.close
    end

    def table(s)
      t = s["totals"]
      out = +"Blackbuck #{s['version']}  master pid #{s['pid']}  " \
              "workers #{t['workers']} (busy #{t['busy']}, idle #{t['idle']})  " \
              "requests #{t['requests']}  connections #{t['connections']}  queued #{t['queued']}  " \
              "spilled #{t['spill_bytes'].to_i} bytes\n\n"
      rows = s["workers"].map do |w|
        current = w["path"] ? "#{w['method']} #{w['path']}" : "-"
        running = w["running_ms"].to_i.positive? ? format("%.3fs", w["running_ms"] / 1000.0) : "-"
        [w["index"], w["pid"], w["state"], w["requests"], w["connections"], current, running,
         w["heartbeat_age_ms"] ? "#{w['heartbeat_age_ms']}ms" : "-"]
      end
      out << grid(%w[WORKER PID STATE REQUESTS CONNS CURRENT RUNNING HEARTBEAT], rows)
      out << "\n"
      lrows = s["listeners"].map { |l| [l["name"], l["queued"] || "?", l["backlog"] || "?"] }
      out << grid(%w[LISTENER QUEUED BACKLOG], lrows)
    end

    def grid(header, rows)
      cells = [header, *rows].map { |r| r.map(&:to_s) }
      widths = header.each_index.map { |i| cells.map { |r| r[i].size }.max }
      cells.map { |r| "#{r.each_with_index.map { |c, i| c.ljust(widths[i]) }.join('  ').rstrip}\n" }.join
    end
  end
end
