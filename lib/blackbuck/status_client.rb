# frozen_string_literal: true

require "json"
require "optparse"
require "socket"
require_relative "errors"
require_relative "option_errors"
require_relative "listeners"

module Blackbuck
  # `blackbuck status [--json] [-c FILE] [ADDR]`: fetches GET /status from a master's
  # stats_listen address and prints it as a table (or the raw JSON). Without ADDR the address
  # is the stats_listen of the config file given with -c (without -c, config/blackbuck.rb when it
  # exists, the file the server itself reads), else $BLACKBUCK_STATS. Exit 0 on
  # success; 1 when the address does not answer, is not a status listener, or the config file
  # is broken; 2 for usage mistakes (no address at all). Every error is one line on stderr.
  class StatusClient
    TIMEOUT = 5                   # seconds for connect + answer
    MAX_ANSWER = 16 * 1024 * 1024 # bytes of answer read at most
    ENV_ADDR = "BLACKBUCK_STATS"
    MARK = "blackbuck-status"     # the header only the status listener sends (StatusServer::MARK)
    JSON_SHAPE = { "pid" => Integer, "workers" => Array, "listeners" => Array, "totals" => Hash }.freeze

    # The address answered, but not as a Blackbuck status listener; the message says what it did.
    class NotStatusListener < StandardError; end
    # A usage mistake (exit 2).
    class UsageError < StandardError; end

    def initialize(argv, env: ENV, out: $stdout, err: $stderr)
      @argv = argv.dup
      @env = env
      @out = out
      @err = err
      @json = false
    end

    def run
      parser = OptionParser.new do |o|
        o.banner = "Usage: blackbuck status [--json] [-c FILE] [ADDR]"
        o.separator "ADDR: HOST:PORT or unix:/path, as given to --stats-listen. Without it: the stats_listen"
        o.separator "of the config file given with -c (default config/blackbuck.rb when present), else $#{ENV_ADDR}."
        o.on("--json", "print the raw JSON") { @json = true }
        o.on("-c", "--config FILE", "read the address from this config file's stats_listen") { |f| @config_file = f }
      end
      rest = parser.parse(@argv)
      raise UsageError, "want at most one ADDR, got #{rest.join(' ')} (see blackbuck status --help)" if rest.size > 1

      addr = rest.first || configured_address
      body, snapshot = fetch(addr)
      @json ? @out.puts(body) : @out.print(table(snapshot))
      0
    rescue OptionParser::ParseError => e
      @err.puts "blackbuck status: #{OptionErrors.line(e, parser)} (see blackbuck status --help)"
      2
    rescue UsageError => e
      @err.puts "blackbuck status: #{e.message}"
      2
    rescue ConfigError => e
      @err.puts "blackbuck status: #{e.message}"
      1
    rescue NotStatusListener => e
      @err.puts "blackbuck status: #{addr} is not a Blackbuck status listener (#{e.message})"
      1
    rescue SystemCallError, IOError, SocketError => e
      @err.puts "blackbuck status: cannot read status from #{addr}: #{e.message}"
      1
    end

    private

    # stats_listen of -c FILE (evaluated with Config::DSL: hooks are stored, never run), else
    # $BLACKBUCK_STATS.
    def configured_address
      require_relative "config"
      @config_file ||= Config::DEFAULT_FILE if File.file?(Config::DEFAULT_FILE)
      if @config_file
        addr = Config::DSL.load(Config.new, @config_file)[:stats_listen]
        return addr if addr
      end
      addr = @env[ENV_ADDR].to_s.strip
      return addr unless addr.empty?

      missing = @config_file ? "#{@config_file} sets no stats_listen and $#{ENV_ADDR} is not set" : "no address"
      raise UsageError, "#{missing}: give ADDR, -c FILE with stats_listen, or set #{ENV_ADDR} " \
                        "(e.g. #{ENV_ADDR}=127.0.0.1:9393)"
    end

    # [the JSON text, its Hash]; raises NotStatusListener for any other answer.
    def fetch(addr)
      kind, host, where = Listeners.parse(addr)
      sock = if kind == :unix
               Socket.unix(where)
             else
               Socket.tcp(host == "0.0.0.0" ? "127.0.0.1" : host, where, connect_timeout: TIMEOUT)
             end
      sock.write("GET /status HTTP/1.1\r\nHost: blackbuck\r\nConnection: close\r\n\r\n")
      body = read_answer(sock)
      snapshot = begin
        JSON.parse(body)
      rescue JSON::ParserError
        nil
      end
      unless snapshot.is_a?(Hash) && JSON_SHAPE.all? { |key, type| snapshot[key].is_a?(type) }
        raise NotStatusListener, "its answer is not Blackbuck status JSON"
      end

      [body, snapshot]
    ensure
      sock&.close
    end

    # Reads until the answer can be judged: a status listener's is HTTP, 200, carries MARK and
    # has a Content-Length; anything else is refused as soon as it shows. Returns the body.
    def read_answer(sock)
      raw = String.new(capacity: 65_536) # binary, like what read_nonblock returns
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + TIMEOUT
      loop do
        body = judge(raw)
        return body if body

        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise IOError, "no answer within #{TIMEOUT}s" if left <= 0

        chunk = sock.read_nonblock(65_536, exception: false)
        case chunk
        when :wait_readable then sock.wait_readable(left)
        when nil then raise IOError, raw.empty? ? "the connection closed without an answer" : "the answer was cut short"
        else raw << chunk
        end
      end
    end

    # nil while more bytes are needed; the body once complete; raises for a foreign answer.
    def judge(raw)
      prefix = raw.byteslice(0, 5)
      raise NotStatusListener, "it did not answer in HTTP" unless "HTTP/".start_with?(prefix)
      raise NotStatusListener, "its answer is larger than #{MAX_ANSWER} bytes" if raw.bytesize > MAX_ANSWER

      head, body = raw.split("\r\n\r\n", 2)
      return nil unless body

      lines = head.split("\r\n")
      code = lines.shift[%r{\AHTTP/\d\.\d (\d{3})}, 1]
      raise NotStatusListener, "it did not answer in HTTP" unless code
      raise NotStatusListener, "it answered #{code}" unless code == "200"

      fields = lines.to_h do |line|
        name, value = line.split(":", 2)
        [name.to_s.strip.downcase, value.to_s.strip]
      end
      raise NotStatusListener, "it answered 200 without a #{MARK} header" unless fields.key?(MARK)

      length = Integer(fields["content-length"].to_s, 10, exception: false)
      raise NotStatusListener, "its answer has no Content-Length" unless length
      return nil if body.bytesize < length

      body.byteslice(0, length)
    end

    # "last 60s: 1234 requests  queue p50 0.012ms p99 3.1ms  app p50 0.038ms p99 12.0ms  shed 0"
    def recent_line(r)
      return "recent: -" unless r

      ms = ->(v) { v ? StatusClient.ms(v) : "-" }
      span = r["seconds"] ? "last #{r['seconds'].round}s" : "since start"
      "#{span}: #{r['requests']} requests  queue p50 #{ms[r.dig('queue_time', 'p50')]} p99 #{ms[r.dig('queue_time', 'p99')]}" \
        "  app p50 #{ms[r.dig('duration', 'p50')]} p99 #{ms[r.dig('duration', 'p99')]}  shed #{r['shed']}"
    end

    # Seconds as milliseconds: 0.1 ms resolution from 1 ms on, microseconds below (a 35 us request
    # reads 0.035ms, not 0.0ms or 1.0ms).
    def self.ms(seconds)
      ms = seconds * 1000
      ms < 1 ? format("%.3fms", ms) : format("%.1fms", ms)
    end

    def table(s)
      t = s["totals"]
      out = +"Blackbuck #{s['version']}  master pid #{s['pid']}  " \
              "workers #{t['workers']} (busy #{t['busy']}, idle #{t['idle']})  " \
              "requests #{t['requests']}  connections #{t['connections']}  streams #{t['streams'].to_i}  queued #{t['queued']}  " \
              "spilled #{t['spill_bytes'].to_i} bytes\n"
      out << "#{recent_line(s['recent'])}\n"
      out << "#{memory_line(s['processes'])}\n" if s["processes"]
      out << "#{refork_line(s['refork'])}\n" if refork_line(s["refork"])
      out << "\n"
      rows = s["workers"].map do |w|
        current = w["path"] ? "#{w['method']} #{w['path']}" : "-"
        running = w["running_ms"].to_i.positive? ? format("%.3fs", w["running_ms"] / 1000.0) : "-"
        [w["index"], w["pid"], w["state"], w["requests"], w["connections"], w["streams"].to_i, current, running,
         w["heartbeat_age_ms"] ? "#{w['heartbeat_age_ms']}ms" : "-", w["generation"] || "-", mib(w["uss_kib"])]
      end
      # STREAMS: open streams (responses whose body waits on a fiber: the streams setting), within CONNS
      out << grid(%w[WORKER PID STATE REQUESTS CONNS STREAMS CURRENT RUNNING HEARTBEAT GEN USS], rows)
      out << "\n"
      lrows = s["listeners"].map { |l| [l["name"], l["queued"] || "?", l["backlog"] || "?"] }
      out << grid(%w[LISTENER QUEUED BACKLOG], lrows)
    end

    # "memory (USS): master 15.1 MiB, mold 30.2 MiB, 4 workers 120.4 MiB; total PSS 180.3 MiB"
    def memory_line(processes)
      by_role = processes.group_by { |p| p["role"] }
      parts = %w[master mold].flat_map { |role| (by_role[role] || []).map { |p| "#{role} #{mib(p['uss_kib'])}" } }
      workers = by_role["worker"] || []
      parts << "#{workers.size} workers #{mib(workers.sum { |p| p['uss_kib'].to_i })}" unless workers.empty?
      pss = processes.sum { |p| p["pss_kib"].to_i }
      "memory (USS): #{parts.join(', ')}; total PSS #{mib(pss)}"
    end

    # "refork: generation 2, mold pid 4321" (refork_after), or nil when there is nothing to say
    def refork_line(r)
      return nil unless r && (r["mold"] || r["booting"] || r["generation"].to_i.positive?)

      mold = r["mold"] && ", mold pid #{r['mold']['pid']}#{' (booted the app)' if r['mold']['booted_app']}"
      "refork: generation #{r['generation']}#{mold}#{", a mold booting the app (pid #{r['booting']})" if r['booting']}"
    end

    def mib(kib) = kib ? format("%.1f MiB", kib / 1024.0) : "-"

    def grid(header, rows)
      cells = [header, *rows].map { |r| r.map(&:to_s) }
      widths = header.each_index.map { |i| cells.map { |r| r[i].size }.max }
      cells.map { |r| "#{r.each_with_index.map { |c, i| c.ljust(widths[i]) }.join('  ').rstrip}\n" }.join
    end
  end
end
