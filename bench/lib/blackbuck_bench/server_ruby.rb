# frozen_string_literal: true

require "open3"
require "rbconfig"

module BlackbuckBench
  # The Ruby the servers run on, chosen apart from the Ruby that runs the harness (rake may run on
  # Debian's 3.1 while the servers run on 3.4). One per run, set before anything asks a recipe
  # whether it is installed (ServerRuby.current=). Its gems (the peers bench/setup installs) are in
  # a directory of its own, tmp/bench-gems/MAJOR.MINOR.
  #
  # Which Ruby (Options): --ruby or BENCH_RUBY, a version of the test matrix (3.4, 4.0, 3.1: found
  # as test/matrix.rb finds a lane's Ruby) or a ruby executable or its bin/ directory; else 3.4 for
  # a full run (the issue-34 default) and, in --quick, the Ruby running the harness (CI's lanes run
  # bench:quick with their own Ruby).
  class ServerRuby
    DEFAULT = "3.4"   # a full run's
    CURRENT = "current" # the Ruby running the harness
    # YJIT on by default for the Ruby servers (the plain rows run with it; their no-YJIT twins only
    # on the workloads that compare the two): what a 2026 production app runs on these Rubies.
    YJIT_BY_DEFAULT = %w[3.4 4.0].freeze
    # RUBY_MN_THREADS=1 (M:N threads) is read by Ruby >= 3.3; older Rubies ignore it.
    MN_THREADS = %w[3.3 3.4 4.0].freeze

    ROOT = File.expand_path("../../..", __dir__)
    GEM_ROOT = ENV.fetch("BENCH_GEM_ROOT", File.join(ROOT, "tmp", "bench-gems"))

    attr_reader :bin, :version, :full_version, :abi, :default_gem_path, :description

    # The bin/ directory of `spec` (see the class comment), or raises ArgumentError saying why not.
    def self.find_bin(spec, env: ENV)
      return File.dirname(RbConfig.ruby) if spec.nil? || spec == CURRENT

      if spec.include?("/")
        ruby = File.directory?(spec) ? File.join(spec, "ruby") : spec
        raise ArgumentError, "BENCH_RUBY=#{spec}: no ruby there" unless File.executable?(ruby)

        return File.dirname(File.expand_path(ruby))
      end
      require File.join(ROOT, "test", "matrix")
      lane = TestMatrix.lane(spec) or
        raise ArgumentError, "BENCH_RUBY=#{spec}: not a Ruby of test/matrix.rb (#{TestMatrix::LANES.map(&:version).join(', ')}) nor a path"
      bin, why = TestMatrix.find_ruby(lane, env: env)
      raise ArgumentError, "BENCH_RUBY=#{spec}: #{why}" unless bin

      bin
    end

    def self.resolve(spec, env: ENV) = new(find_bin(spec, env: env))

    # The run's Ruby; the Ruby running the harness until a run sets it.
    def self.current = @current ||= new(File.dirname(RbConfig.ruby))

    class << self
      attr_writer :current
    end

    # facts: what `bin/ruby` says of itself (tests pass them in, to build one without running it)
    def initialize(bin, facts: nil)
      @bin = bin
      facts ||= ask(File.join(bin, "ruby"))
      @full_version = facts.fetch("version")
      @version = @full_version[/\A\d+\.\d+/]
      @abi = facts.fetch("abi")
      @default_gem_path = facts.fetch("gem_path")
      @description = facts.fetch("description")
    end

    def ruby = File.join(@bin, "ruby")

    # bench/setup's gem directory for this Ruby (BENCH_GEM_HOME overrides, for one Ruby).
    def gem_home = ENV.fetch("BENCH_GEM_HOME") { File.join(GEM_ROOT, @version) }

    def yjit_by_default? = YJIT_BY_DEFAULT.include?(@version)

    def mn_threads? = MN_THREADS.include?(@version)

    # Debian 12's own Ruby: Debian's unicorn, puma 5.6 and Rails 6.1 packages are built for it.
    def debian? = @bin == "/usr/bin"

    def setup_hint = "BENCH_RUBY=#{@version} bench/setup"

    def to_h = { "version" => @full_version, "bin" => @bin, "description" => @description,
                 "yjit_by_default" => yjit_by_default?, "gem_home" => gem_home }

    private

    def ask(ruby)
      code = 'require "json"; print JSON.generate("version" => RUBY_VERSION, "abi" => RbConfig::CONFIG["ruby_version"], ' \
             '"gem_path" => Gem.default_path, "description" => RUBY_DESCRIPTION)'
      out, status = Open3.capture2({ "RUBYOPT" => nil, "RUBYLIB" => nil, "BUNDLE_GEMFILE" => nil }, ruby, "-e", code)
      raise ArgumentError, "#{ruby} did not answer: #{out}" unless status.success?

      require "json"
      JSON.parse(out)
    end
  end
end

# `ruby server_ruby.rb bin SPEC`: the bin/ directory of SPEC (bench/setup's BENCH_RUBY).
if $PROGRAM_NAME == __FILE__
  abort "usage: ruby #{__FILE__} bin VERSION|PATH" unless ARGV.size == 2 && ARGV[0] == "bin"
  begin
    puts BlackbuckBench::ServerRuby.find_bin(ARGV[1])
  rescue ArgumentError => e
    abort e.message
  end
end
