# frozen_string_literal: true

require "rbconfig"
require "open3"
require "fileutils"

# The Rubies Blackbuck supports and what CI runs on each (one lane per Ruby), in one place:
# `rake ci` runs every lane, each in a process of its own Ruby (`rake ci:lane`), and bin/setup
# installs each lane's bundles (`ruby test/matrix.rb setup`).
#
# Where a lane's Ruby comes from, first found wins:
#   1. BLACKBUCK_RUBY_3_4 (likewise _4_0, _3_1): a `ruby` executable or the bin/ directory holding one;
#   2. ../shared/rubies/use-ruby VERSION beside the checkout (this project's machines);
#   3. the `ruby` on PATH when it is that version (Debian 12's is 3.1).
# A lane whose Ruby is missing is announced in a banner and in the summary; with CI=true it fails the run.
module TestMatrix
  ROOT = File.expand_path("..", __dir__)
  USE_RUBY = File.expand_path("../shared/rubies/use-ruby", ROOT)

  # task: a rake task the lane runs; env: set for that task only.
  Step = Struct.new(:task, :env)

  # version: "MAJOR.MINOR"; bundles: [gemfile, BUNDLE_PATH or nil, :clean or nil] that bin/setup
  # installs with this Ruby.
  Lane = Struct.new(:version, :role, :steps, :bundles) do
    def env_name = "BLACKBUCK_RUBY_#{version.tr('.', '_')}"
    def tasks = steps.map(&:task)
  end

  def self.step(task, env = {}) = Step.new(task, env)

  # M:N threads (Ruby >= 3.3): what Puma's arena entries and HttpArena run with `--threads`.
  MN = { "RUBY_MN_THREADS" => "1" }.freeze
  # Every process of the step reports Ruby's deprecation warnings about our code (chilled strings
  # mutated, ...) to a log that `rake test:deprecations` reads (test/support/deprecations.rb).
  # RUBYOPT is added to (Bundler's -rbundler/setup stays), not replaced.
  DEPRECATIONS = { "RUBYOPT" => "-W:deprecated -r#{File.join(ROOT, 'test/support/deprecations.rb')}",
                   "BLACKBUCK_DEPRECATIONS_LOG" => File.join(ROOT, "tmp/deprecations.log") }.freeze
  CACHE = File.join(Dir.home, ".cache/blackbuck")
  BASE_VERSION = "3.1" # Debian 12's Ruby

  # 3.4 is the primary Ruby: everything runs there, including what does not depend on the Ruby
  # (C tests, fuzzing, blackbuck-load). 4.0 and 3.1 run the unit, integration, faults and threads
  # suites; 3.1 also the Rails 6.1/7.2 apps and the Rails 7.2 browser suite, and the benchmark
  # smoke run (the harness and its peers are on Debian's Ruby until the benchmark moves).
  LANES = [
    Lane.new("3.4", "primary: every suite",
             [step("compile"), step("compile:warnings"), step("test", DEPRECATIONS), step("test:deprecations"), step("test:slow"), step("test:hardening"), step("test:faults"),
              step("test:rack2"), step("test:rails"), step("test:browser"), step("test:cluster"), step("test:poll"),
              step("test:threads", MN), step("c:test"), step("loadgen:test"), step("fuzz:quick")],
             [["Gemfile", nil], ["gemfiles/rack2.gemfile", nil], ["gemfiles/rails7.gemfile", nil], ["gemfiles/rails8.gemfile", nil],
              # `bundle clean` after: the generated app resolves `bundle install --local` from this
              # directory, so only what the lockfile names may be there (another version would be its choice)
              ["gemfiles/browser8.gemfile", ENV.fetch("BLACKBUCK_BROWSER8_GEMS") { File.join(CACHE, "browser8-gems") }, :clean]]),
    Lane.new("4.0", "unit, integration, faults, threads (M:N)",
             [step("compile"), step("compile:warnings"), step("test", DEPRECATIONS), step("test:deprecations"), step("test:faults"),
              step("test:threads", MN)],
             [["Gemfile", nil]]),
    Lane.new("3.1", "unit, integration, faults, threads, Rails 6.1/7.2, Rails 7.2 browser, bench smoke",
             [step("compile"), step("compile:warnings"), step("test"), step("test:faults"), step("test:threads"), step("test:rails"),
              step("test:browser"), step("bench:quick")],
             [["Gemfile", nil], ["gemfiles/rack2.gemfile", nil], ["gemfiles/rails61.gemfile", nil],
              ["gemfiles/rails7.gemfile", nil],
              ["gemfiles/browser.gemfile", ENV.fetch("BLACKBUCK_BROWSER_GEMS") { File.join(CACHE, "browser-gems") }]])
  ].freeze

  def self.lane(version) = LANES.find { |l| l.version == version }

  # The gemfile to give BUNDLE_GEMFILE for gemfiles/NAME.gemfile under this Ruby: a one-line file
  # in tmp/gemfiles/ruby-X.Y/ that evaluates it, so each Ruby resolves it into a lockfile of its
  # own (Bundler keeps the lockfile beside the gemfile: one shared by 3.1 and 3.4 would be resolved
  # again by each lane, and the two want different versions, e.g. nokogiri's precompiled gems).
  def self.gemfile(relative, version: RUBY_VERSION[/\A\d+\.\d+/])
    source = File.join(ROOT, relative)
    return source if File.basename(source) == "Gemfile" # the project's own: Gemfile.lock is committed
    # Debian's Ruby keeps the lockfiles beside the gemfiles, where the benchmark harness (still on
    # that Ruby) reads them too.
    return source if version == BASE_VERSION

    dir = File.join(ROOT, "tmp/gemfiles/ruby-#{version}")
    wrapper = File.join(dir, File.basename(source))
    text = "# Written by test/matrix.rb: #{relative} with a lockfile of Ruby #{version}'s own.\neval_gemfile #{source.inspect}\n"
    unless File.exist?(wrapper) && File.read(wrapper) == text
      FileUtils.mkdir_p(dir)
      File.write(wrapper, text)
    end
    wrapper
  end

  # The lane of the Ruby running this code, or nil.
  def self.current = lane(RUBY_VERSION[/\A\d+\.\d+/])

  # The bin/ directory of the lane's Ruby, or [nil, why].
  def self.find_ruby(lane, env: ENV)
    if (given = env[lane.env_name]) && !given.empty?
      ruby = File.directory?(given) ? File.join(given, "ruby") : given
      return [File.dirname(ruby), nil] if version_of(ruby) == lane.version

      return [nil, "#{lane.env_name}=#{given} is not a Ruby #{lane.version} (#{version_of(ruby) || 'no ruby there'})"]
    end
    if File.executable?(USE_RUBY)
      out, status = Open3.capture2(USE_RUBY, lane.version, err: File::NULL)
      return [out.strip, nil] if status.success? && version_of(File.join(out.strip, "ruby")) == lane.version
    end
    on_path = env.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "ruby") }.find { |r| File.executable?(r) }
    return [File.dirname(on_path), nil] if on_path && version_of(on_path) == lane.version

    [nil, "no Ruby #{lane.version}: set #{lane.env_name} to its ruby, or put this project's shared/rubies beside the checkout"]
  end

  def self.version_of(ruby)
    return nil unless File.executable?(ruby)

    out, status = Open3.capture2(ruby, "-e", "print RUBY_VERSION[/\\A\\d+\\.\\d+/]", err: File::NULL)
    status.success? ? out : nil
  end

  # Which lanes to run: BLACKBUCK_LANES="3.4 4.0" picks some; all by default.
  def self.selected(env: ENV)
    wanted = env.fetch("BLACKBUCK_LANES", "").split(/[\s,]+/)
    return LANES if wanted.empty?

    unknown = wanted - LANES.map(&:version)
    raise ArgumentError, "BLACKBUCK_LANES names #{unknown.join(', ')}: the lanes are #{LANES.map(&:version).join(', ')}" if unknown.any?

    LANES.select { |l| wanted.include?(l.version) }
  end

  def self.banner(text) = "\n#{'=' * 100}\n== #{text}\n#{'=' * 100}"

  # The environment a lane's process starts from: this one without what `bundle exec` added
  # (the lane runs `bundle exec` of its own Ruby), with the lane's Ruby first on PATH.
  def self.lane_env(bin)
    base = defined?(Bundler) ? Bundler.unbundled_env : ENV.to_h
    base.reject { |k, _| k.start_with?("GEM_") || k == "RUBYOPT" || k == "RUBYLIB" }
        .merge("PATH" => [bin, base["PATH"]].compact.join(File::PATH_SEPARATOR))
  end

  # bin/setup's Ruby part: with each lane's Ruby, its bundles. Missing Rubies are said loudly.
  def self.setup(out: $stdout)
    missing = []
    selected.each do |lane|
      bin, why = find_ruby(lane)
      next missing << "#{lane.version}: #{why}" unless bin

      out.puts "bin/setup: Ruby #{lane.version} (#{bin}): #{lane.bundles.map(&:first).join(', ')}"
      lane.bundles.each do |gemfile, path, clean|
        env = lane_env(bin).merge("BUNDLE_GEMFILE" => gemfile(gemfile, version: lane.version))
        env["BUNDLE_PATH"] = path if path
        system(env, File.join(bin, "bundle"), "install", "--quiet", chdir: ROOT, unsetenv_others: true) ||
          abort("bin/setup: bundle install of #{gemfile} with Ruby #{lane.version} failed")
        next unless clean

        system(env, File.join(bin, "bundle"), "clean", chdir: ROOT, out: File::NULL, unsetenv_others: true) ||
          abort("bin/setup: bundle clean of #{gemfile} with Ruby #{lane.version} failed")
      end
      log = File.join(ROOT, "tmp", "compile-#{lane.version}.log")
      FileUtils.mkdir_p(File.dirname(log))
      system(lane_env(bin), File.join(bin, "bundle"), "exec", "rake", "compile", chdir: ROOT, out: log, err: %i[child out],
             unsetenv_others: true) ||
        abort("bin/setup: rake compile with Ruby #{lane.version} failed:\n#{File.read(log).lines.last(30).join}")
    end
    missing.each { |m| warn banner("MISSING RUBY #{m}") }
    missing.empty?
  end

  # rake ci: every selected lane, each in its own Ruby's process; a summary with the time of each.
  # True when every lane ran and passed (a missing lane fails the run only with CI=true).
  def self.run(out: $stdout, env: ENV)
    results = selected(env: env).map do |lane|
      bin, why = find_ruby(lane, env: env)
      unless bin
        warn banner("LANE #{lane.version} NOT RUN: #{why}")
        next [lane, :missing, 0, why]
      end
      out.puts banner("LANE Ruby #{lane.version} (#{lane.role}): #{bin}/ruby\n== #{lane.tasks.join(' ')}")
      out.flush
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      ok = system(lane_env(bin).merge("BLACKBUCK_LANE" => lane.version), File.join(bin, "bundle"), "exec", "rake", "ci:lane",
                  chdir: ROOT, unsetenv_others: true)
      [lane, ok ? :passed : :failed, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, nil]
    end
    out.puts banner("CI matrix")
    results.each do |lane, state, secs, why|
      out.puts format("  Ruby %-4s %-8s %6.0f s  %s", lane.version, state, secs, why || lane.tasks.join(" "))
    end
    failed = results.count { |_, s| s == :failed }
    missing = results.count { |_, s| s == :missing }
    strict = env["CI"] == "true"
    out.puts "  #{results.size - failed - missing} lanes passed, #{failed} failed, #{missing} not run" \
             "#{' (CI=true: a lane not run fails the run)' if missing.positive? && strict}"
    # the run's closing line: a lane not run counts as failed under CI=true, as skipped elsewhere
    out.puts "lanes: #{results.size - failed - missing} passed, #{failed + (strict ? missing : 0)} failed" \
             "#{", #{missing} skipped" if missing.positive? && !strict}"
    failed.zero? && (missing.zero? || !strict)
  end
end

if $PROGRAM_NAME == __FILE__
  case ARGV.first
  when "setup" then exit(TestMatrix.setup ? 0 : (ENV["CI"] == "true" ? 1 : 0))
  when "rubies"
    TestMatrix::LANES.each { |l| puts [l.version, TestMatrix.find_ruby(l).compact.first].join(" ") }
  else abort "usage: ruby test/matrix.rb setup|rubies"
  end
end
