# frozen_string_literal: true

# Generates the memory workload's Rails app (bench/README.md, "memory"): what `rails new` of Rails
# 7.2.4 makes with its defaults but JavaScript, 15 related scaffolds, ~640 seeded rows, readied for
# production as a deploy does (database created, migrated and seeded; assets precompiled). Not
# committed: made into tmp/bench-rails-memory of the checkout by the harness when the memory workload
# first runs (BlackbuckBench::MemoryRun), or by hand with the command below.
#
#   ruby bench/apps/memory_rails/generate.rb [DIR]
#
# Idempotent: a finished app carries a stamp with this file's digest; it is kept while the stamp
# matches and made again otherwise. The app is built in DIR.new and renamed at the end, so a failed
# run never leaves a half-made app that looks finished. Offline: `bundle install --local` from the
# Rails 7.2 gem directory bin/setup fills for the browser suite (gemfiles/browser.gemfile), as
# test/browser/generated_app.rb does.
require "digest"
require "fileutils"
require "json"
require "securerandom"

module MemoryRailsApp
  ROOT = File.expand_path("../../..", __dir__)
  DIR = File.join(ROOT, "tmp", "bench-rails-memory")
  GEM_DIR = ENV.fetch("BLACKBUCK_BROWSER_GEMS") { File.join(Dir.home, ".cache/blackbuck/browser-gems") }
  BROWSER_GEMFILE = File.join(ROOT, "gemfiles", "browser.gemfile")
  STAMP = ".bench-generated"  # the digest of this file, written last
  ENV_FILE = "bench-env.json" # what every server is started with (read by the harness)
  STEP_TIMEOUT_S = 300        # a bound for one generator, bundler or rake run that went wrong

  # name => [attributes, parents (belongs_to), rows seeded]. Parents come first: seeds refer to
  # their ids. 15 resources, 640 rows.
  RESOURCES = {
    "Author" => [%w[name:string email:string bio:text], [], 40],
    "Category" => [%w[name:string description:text], [], 20],
    "Tag" => [%w[name:string], [], 30],
    "Publisher" => [%w[name:string city:string], [], 10],
    "Library" => [%w[name:string address:string], [], 10],
    "Post" => [%w[title:string body:text published:boolean], %w[author category], 80],
    "Comment" => [%w[body:text rating:integer], %w[post author], 120],
    "Tagging" => [%w[weight:integer], %w[post tag], 60],
    "Book" => [%w[title:string isbn:string pages:integer], %w[author publisher], 50],
    "Review" => [%w[body:text stars:integer], %w[book author], 60],
    "Section" => [%w[label:string floor:integer], %w[library], 30],
    "Loan" => [%w[due_on:date returned:boolean], %w[book section], 40],
    "Event" => [%w[title:string starts_at:datetime], %w[category], 30],
    "Attendee" => [%w[role:string], %w[event author], 40],
    "Note" => [%w[body:text], %w[post], 20]
  }.freeze

  # Rails 8.1's gem directory (bin/setup installs gemfiles/browser8.gemfile there with Ruby 3.4)
  GEM_DIR8 = ENV.fetch("BLACKBUCK_BROWSER8_GEMS") { File.join(Dir.home, ".cache/blackbuck/browser8-gems") }

  module_function

  # The gem directory the app resolves from on the servers' Ruby: Rails 7.2's for Debian's 3.1,
  # Rails 8.1's for 3.4 and 4.0 (the harness's BlackbuckBench::ServerRuby; nil: 3.1's).
  def gem_dir(ruby = nil) = ruby.nil? || ruby.debian? ? GEM_DIR : GEM_DIR8

  def digest = Digest::SHA256.file(__FILE__).hexdigest[0, 16]

  def ready?(dir) = File.exist?(File.join(dir, STAMP)) && File.read(File.join(dir, STAMP)).strip == digest

  # Every endpoint the workload loads: per resource index and show, in HTML and JSON, new and edit.
  def endpoints
    RESOURCES.keys.flat_map do |model|
      base = "/#{plural(model.downcase)}"
      [base, "#{base}.json", "#{base}/1", "#{base}/1.json", "#{base}/new", "#{base}/1/edit"]
    end
  end

  # Rails' plural of the names above (they are chosen so that these two rules are all it takes).
  def plural(word) = word.end_with?("y") ? "#{word.chomp('y')}ies" : "#{word}s"

  def generate(dir)
    return puts("memory_rails: #{dir} is up to date") if ready?(dir)
    raise "no Rails 7.2 gem directory at #{GEM_DIR} (bin/setup installs gemfiles/browser.gemfile there)" unless Dir.exist?(GEM_DIR)

    work = "#{dir}.new"
    FileUtils.rm_rf(work)
    FileUtils.mkdir_p(File.dirname(work))
    @log = "#{dir}.log"
    File.write(@log, "")
    App.new(work, @log).build
    File.write(File.join(work, STAMP), "#{digest}\n")
    FileUtils.rm_rf(dir)
    File.rename(work, dir)
    puts "memory_rails: generated #{dir} (#{endpoints.size} endpoints; log #{@log})"
  end

  # One build of the app in dir.
  class App
    def initialize(dir, log)
      @dir = dir
      @log = log
      @secret = SecureRandom.hex(64)
    end

    def build
      # the browser suite's bundle has railties 7.2.4: its `rails new`, without JavaScript (no
      # importmap download) and without the bundle (ours is --local below)
      run({ "BUNDLE_GEMFILE" => BROWSER_GEMFILE, "BUNDLE_PATH" => GEM_DIR }, "bundle", "exec", "rails", "new", @dir,
          "--skip-bundle", "--skip-git", "--skip-javascript", chdir: File.dirname(@dir))
      bundle
      RESOURCES.each do |model, (attrs, parents, _)|
        rails("generate", "scaffold", model, *attrs, *parents.map { |p| "#{p}:references" })
      end
      add_has_many
      write_seeds
      configure_production
      rails("db:prepare", "assets:precompile", env: production_env)
      File.write(path(ENV_FILE), JSON.pretty_generate(production_env.merge("RAILS_LOG_LEVEL" => "warn")) + "\n")
    end

    def path(rel) = File.join(@dir, rel)

    private

    # As test/browser/generated_app.rb: no error_highlight line (Ruby 3.1 loads its own before
    # Bundler, which cannot swap a default gem), this checkout as the blackbuck gem, --local.
    def bundle
      gemfile = File.read(path("Gemfile")).lines.reject { |l| l.include?('gem "error_highlight"') }.join
      File.write(path("Gemfile"), "#{gemfile}\ngem \"blackbuck\", path: #{ROOT.inspect}\n")
      run({}, "bundle", "config", "set", "--local", "path", GEM_DIR)
      run({}, "bundle", "install", "--local", "--quiet")
    end

    def add_has_many
      children = Hash.new { |h, k| h[k] = [] }
      RESOURCES.each { |model, (_, parents, _)| parents.each { |p| children[p] << model.downcase } }
      children.each do |parent, kids|
        file = "app/models/#{parent}.rb"
        lines = kids.map { |k| "  has_many :#{MemoryRailsApp.plural(k)}, dependent: :destroy\n" }
        edit(file, /^class .*\n/) { |m| m + lines.join }
      end
    end

    # Deterministic rows (Random seed 24): the same pages in every generation.
    def write_seeds
      seeds = +"rng = Random.new(24)\n"
      RESOURCES.each do |model, (attrs, parents, count)|
        fields = attrs.map do |a|
          name, type = a.split(":")
          value = case type
                  when "string" then %("#{name} \#{i} " + "x" * rng.rand(4..24))
                  when "text" then %("#{model} #{name} \#{i}. " * rng.rand(2..8))
                  when "integer" then "rng.rand(1..500)"
                  when "boolean" then "rng.rand(2).zero?"
                  when "date" then "Date.new(2026, 1, 1) + rng.rand(300)"
                  when "datetime" then "Time.utc(2026, 1, 1) + rng.rand(30_000_000)"
                  end
          "#{name}: #{value}"
        end
        fields += parents.map { |p| "#{p}_id: 1 + (i % #{RESOURCES[p.capitalize][2]})" }
        seeds << "#{count}.times { |i| #{model}.create!(#{fields.join(', ')}) }\n"
      end
      File.write(path("db/seeds.rb"), seeds)
    end

    # Production as a deploy without TLS and without Redis has it; the public file server on.
    def configure_production
      edit("config/environments/production.rb", /^  config\.force_ssl = true$/) do
        "  # The benchmark speaks plain HTTP: no redirect to https.\n  config.force_ssl = false"
      end
      edit("config/environments/production.rb", /^end\s*\z/) do
        "  # Assets from public/ by the app itself (no nginx in front in the benchmark).\n" \
          "  config.public_file_server.enabled = true\nend\n"
      end
      edit("config/cable.yml", /^production:\n(  .*\n)+/) { "production:\n  adapter: async\n" }
      # the harness's readiness probe asks for / and wants a 200
      edit("config/routes.rb", /^Rails\.application\.routes\.draw do\n/) { |m| %(#{m}  root "posts#index"\n) }
    end

    def production_env
      { "RAILS_ENV" => "production", "RACK_ENV" => "production", "SECRET_KEY_BASE" => @secret,
        "RAILS_SERVE_STATIC_FILES" => "1", "DATABASE_URL" => "sqlite3:storage/production.sqlite3" }
    end

    def edit(rel, pattern, &block)
      text = File.read(path(rel))
      raise "#{rel} has no #{pattern.inspect}" unless text.match?(pattern)

      File.write(path(rel), text.sub(pattern, &block))
    end

    def rails(*args, env: {}) = run(env, "bin/rails", *args)

    # Runs cmd to completion in the app (bounded), outside any bundle of the caller, raising with
    # its output's tail when it fails.
    def run(env, *cmd, chdir: @dir)
      File.write(@log, "$ #{cmd.join(' ')}\n", mode: "a")
      clean = ENV.to_h.reject { |k, _| k.start_with?("BUNDLE_", "BUNDLER_", "GEM_") || %w[RUBYOPT RUBYLIB].include?(k) }
      clean["BUNDLE_GEMFILE"] = path("Gemfile") if File.exist?(path("Gemfile"))
      pid = Process.spawn(clean.merge(env), *cmd, chdir: chdir, out: [@log, "a"], err: %i[child out],
                                                  pgroup: true, unsetenv_others: true)
      status = wait(pid)
      return if status&.success?

      # the error's own lines, not Ruby's backtrace ("\tfrom ...") that follows them
      said = File.read(@log).lines.last(60).grep_v(/^\s+from /).last(5).join.strip
      raise "#{cmd.join(' ')} failed (#{status ? "exit #{status.exitstatus || status}" : "no end in #{STEP_TIMEOUT_S}s"}): #{said}"
    end

    def wait(pid)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STEP_TIMEOUT_S
      loop do
        _, status = Process.waitpid2(pid, Process::WNOHANG)
        return status if status
        break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        sleep 0.1
      end
      Process.kill(:KILL, -pid)
      Process.waitpid(pid)
      nil
    end
  end
end

if $PROGRAM_NAME == __FILE__
  begin
    MemoryRailsApp.generate(File.expand_path(ARGV[0] || MemoryRailsApp::DIR))
  rescue StandardError => e
    warn "memory_rails: #{e.message}"
    exit 1
  end
end
