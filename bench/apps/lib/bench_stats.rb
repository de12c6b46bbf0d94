# frozen_string_literal: true

# Per-worker request counts for the harness's balance column (bench/README.md, "Balance").
# Every bench app is wrapped in BenchStats::Counter when BENCH_STATS_DIR is set, so every server
# runs the same code. A worker counts its requests in an integer; at most every
# FLUSH_INTERVAL_S, on a request, it writes the count to BENCH_STATS_DIR/PID.json (a new file,
# renamed over the old one). The request path costs an increment and one clock read (~0.1 µs):
# no thread (a second Ruby thread makes every GVL release dearer: +3 µs a request for Blackbuck
# here), and no syscall per request (getpid alone is ~1.5 µs on this machine). The requests of a
# worker's last FLUSH_INTERVAL_S before the load stops are written with its next request, so a
# measurement can miss at most that much of each worker's traffic (bench/README.md).
# The file also says which Ruby, Rack and server the worker really runs (YJIT on or not).
require "json"

module BenchStats
  FLUSH_INTERVAL_S = 0.01
  SERVER_VERSIONS = { "blackbuck" => "Blackbuck::VERSION", "puma" => "Puma::Const::PUMA_VERSION",
                      "unicorn" => "Unicorn::Const::UNICORN_VERSION", "pitchfork" => "Pitchfork::VERSION",
                      "iodine" => "Iodine::VERSION", "itsi" => "Itsi::Server::VERSION",
                      "falcon" => "Falcon::VERSION" }.freeze

  def self.dir = ENV["BENCH_STATS_DIR"]

  class Counter
    def initialize(app)
      @app = app
      @pid = nil
      @count = 0
      @next_flush = 0.0
    end

    def call(env)
      @count += 1 # under the GVL: no lock, for the threaded servers too
      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      flush(now) if now >= @next_flush
      @app.call(env)
    end

    private

    def flush(now)
      @next_flush = now + FLUSH_INTERVAL_S
      pid = Process.pid
      if pid != @pid # first flush of this process: a forked worker starts from its own first request
        @count = 1 if @pid
        @pid = pid
        @path = File.join(BenchStats.dir, "#{pid}.json")
        @facts = BenchStats.facts
      end
      tmp = "#{@path}.#{Thread.current.object_id}.tmp" # threaded servers: one temporary file per thread
      File.write(tmp, JSON.generate(@facts.merge("pid" => pid, "requests" => @count)))
      File.rename(tmp, @path) # readers never see half a file
    end
  end

  def self.facts
    servers = SERVER_VERSIONS.filter_map do |name, const|
      "#{name} #{Object.const_get(const)}"
    rescue NameError
      nil
    end
    { "ruby" => RUBY_VERSION, "yjit" => defined?(RubyVM::YJIT) ? RubyVM::YJIT.enabled? : false,
      "rack" => defined?(Rack.release) ? Rack.release : nil, "server" => servers.join(", ") }
  end

  # For a rackup file: `BenchStats.wrap(self)` before `run`.
  def self.wrap(builder)
    builder.use(Counter) if dir
  end
end
