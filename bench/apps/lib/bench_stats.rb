# frozen_string_literal: true

# Per-worker request counts for the harness's balance column (bench/README.md, "Balance").
# Every bench app is wrapped in BenchStats::Counter when BENCH_STATS_DIR is set, so every server
# runs the same code. A worker counts its requests in memory (one integer increment per request)
# and a thread of its own writes the count to BENCH_STATS_DIR/PID.json when it changed, every
# FLUSH_INTERVAL_S: the request path never touches a file. While nothing changes the thread
# sleeps longer and longer (up to IDLE_INTERVAL_S), so the servers that sit idle while another
# one is measured cost next to nothing; under load it is back at FLUSH_INTERVAL_S, so the final
# count is written FLUSH_INTERVAL_S after the load stops. The harness reads the directory before
# and after a measurement (waiting longer than that) and takes the difference.
# The file also says which Ruby, Rack and server the worker really runs (YJIT on or not).
require "json"

module BenchStats
  FLUSH_INTERVAL_S = 0.05
  IDLE_INTERVAL_S = 0.5 # shorter than any measurement (--duration >= 1 s in --quick)
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
    end

    def call(env)
      start unless @pid == Process.pid # first request in this process (workers are forked)
      @count += 1 # one increment under the GVL: no lock, as for threaded servers too
      @app.call(env)
    end

    private

    def start
      @pid = Process.pid
      @count = 0
      path = File.join(BenchStats.dir, "#{@pid}.json")
      facts = BenchStats.facts
      Thread.new do
        written = nil
        interval = FLUSH_INTERVAL_S
        loop do
          count = @count
          if count == written
            interval = [interval * 2, IDLE_INTERVAL_S].min
          else
            tmp = "#{path}.tmp"
            File.write(tmp, JSON.generate(facts.merge("pid" => @pid, "requests" => count)))
            File.rename(tmp, path) # readers never see half a file
            written = count
            interval = FLUSH_INTERVAL_S
          end
          sleep interval
        end
      end
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
