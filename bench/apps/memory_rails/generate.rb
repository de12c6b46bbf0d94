# frozen_string_literal: true

# Generates the memory workload's Rails app (bench/README.md, "memory"): what `rails new` makes
# with its defaults but JavaScript, 15 related scaffolds, ~640 seeded rows, readied for production as
# a deploy does (database created, migrated and seeded; assets precompiled). The Rails is the one the
# servers' Ruby runs in 2026: 8.1.3 on Ruby >= 3.2 (the browser suite's gemfiles/browser8.gemfile and
# gem directory), 7.2.4 on Debian's 3.1 (gemfiles/browser.gemfile's). Not committed: made into
# tmp/bench-rails-memory-X.Y (X.Y: the servers' Ruby) by the harness when the memory workload first
# runs (BlackbuckBench::MemoryStep), or by hand with the command below (RUBY: a ruby or its bin/,
# default the one running it).
#
#   ruby bench/apps/memory_rails/generate.rb [DIR] [--ruby RUBY]
#
# Idempotent: a finished app carries a stamp with this file's digest; it is kept while the stamp
# matches and made again otherwise. The app is built in DIR.new and renamed at the end, so a failed
# run never leaves a half-made app that looks finished. Offline: `bundle install --local` from the
# browser suite's gem directory that bin/setup fills, as test/browser/generated_app.rb does. Every
# command runs with the servers' Ruby's bin/ first on PATH (its bundle, its rails).
require "digest"
require "fileutils"
require "json"
require "open3"
require "rbconfig"
require "securerandom"
require_relative "../../../test/matrix"

module MemoryRailsApp
  ROOT = File.expand_path("../../..", __dir__)
  GEM_DIR = ENV.fetch("BLACKBUCK_BROWSER_GEMS") { File.join(Dir.home, ".cache/blackbuck/browser-gems") }
  # Rails 8.1's gem directory (bin/setup installs gemfiles/browser8.gemfile there with each Ruby >= 3.2)
  GEM_DIR8 = ENV.fetch("BLACKBUCK_BROWSER8_GEMS") { File.join(Dir.home, ".cache/blackbuck/browser8-gems") }
  # The browser suite's template for `rails new -m` (Rails 8): the generator bundles --local from
  # the suite's gem directory and the Gemfile names this checkout; nothing else differs from a
  # user's `rails new`.
  RAILS_NEW_TEMPLATE = File.join(ROOT, "test", "browser", "rails_new_template.rb")

  # One Rails the app is generated with: its version, the browser suite's gemfile that has it
  # (relative to ROOT; test/matrix.rb gives each Ruby its lockfile) and gem directory.
  RailsVersion = Struct.new(:version, :gemfile, :gem_dir, keyword_init: true) do
    def rails8? = version.start_with?("8.")
  end
  RAILS72 = RailsVersion.new(version: "7.2.4", gemfile: "gemfiles/browser.gemfile", gem_dir: GEM_DIR)
  RAILS81 = RailsVersion.new(version: "8.1.3", gemfile: "gemfiles/browser8.gemfile", gem_dir: GEM_DIR8)
  RAILS8_MIN_RUBY = Gem::Version.new("3.2") # Rails 8 needs it (the browser suite's and Rakefile's line)

  # The Ruby the app is made for and run on: what the harness's BlackbuckBench::ServerRuby says of
  # it (bin, full_version, abi), or one asked here when run by hand.
  Ruby = Struct.new(:bin, :full_version, :abi, keyword_init: true)

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

  module_function

  # Rails 8.1 on Ruby >= 3.2, Rails 7.2 on 3.1 (version: a Ruby's RUBY_VERSION).
  def rails_for(version) = Gem::Version.new(version) >= RAILS8_MIN_RUBY ? RAILS81 : RAILS72

  # The app of the servers' Ruby: one directory per Ruby (X.Y), as the apps differ by Rails and
  # by the ABI of their gems.
  def dir_for(version) = File.join(ROOT, "tmp", "bench-rails-memory-#{version[/\A\d+\.\d+/]}")

  # The gem directory the app resolves from on that Ruby (ruby: ServerRuby or Ruby above), and
  # the ABI subdirectory the peers put on GEM_PATH.
  def gem_dir(ruby) = rails_for(ruby.full_version).gem_dir

  def abi_gem_dir(ruby) = File.join(gem_dir(ruby), "ruby", ruby.abi)

  # The Ruby of bin/ (or of the ruby executable given), asked.
  def ruby_at(path)
    ruby = File.directory?(path) ? File.join(path, "ruby") : path
    out, status = Open3.capture2({ "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil }, ruby, "-e",
                                 'print RUBY_VERSION, " ", RbConfig::CONFIG["ruby_version"]')
    raise "#{ruby} did not say its version: #{out}" unless status.success?

    version, abi = out.split
    Ruby.new(bin: File.dirname(File.expand_path(ruby)), full_version: version, abi: abi)
  end

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

  # text with pattern replaced by the block's result (as String#sub), or nil when done matches
  # already (the edit's result is there, or what makes it needless). Raises naming rel and both
  # patterns when neither matches. pattern nil: a check only (done must match).
  def edit_text(rel, text, pattern, done:, &block)
    return nil if text.match?(done)
    raise "#{rel}: no #{done.inspect} (as generated)" unless pattern
    raise "#{rel}: neither #{pattern.inspect} (to edit) nor #{done.inspect} (done already) is there" unless text.match?(pattern)

    text.sub(pattern, &block)
  end

  # Why the app cannot be made for ruby, or nil: its Rails's gems must be installed for that
  # Ruby's ABI (bin/setup does it with each Ruby).
  def missing_gems(ruby)
    rails = rails_for(ruby.full_version)
    return nil if Dir.exist?(abi_gem_dir(ruby))

    "no Rails #{rails.version} gems for Ruby #{ruby.full_version} in #{abi_gem_dir(ruby)} " \
      "(bin/setup installs #{rails.gemfile} there when run with that Ruby)"
  end

  def generate(dir, ruby)
    return puts("memory_rails: #{dir} is up to date") if ready?(dir)

    why = missing_gems(ruby)
    raise why if why

    work = "#{dir}.new"
    FileUtils.rm_rf(work)
    FileUtils.mkdir_p(File.dirname(work))
    @log = "#{dir}.log"
    File.write(@log, "")
    App.new(work, @log, ruby).build
    File.write(File.join(work, STAMP), "#{digest}\n")
    FileUtils.rm_rf(dir)
    File.rename(work, dir)
    puts "memory_rails: generated #{dir} (Rails #{rails_for(ruby.full_version).version} on Ruby #{ruby.full_version}, " \
         "#{endpoints.size} endpoints; log #{@log})"
  end

  # One build of the app in dir, for ruby (its bin/ first on PATH in every command).
  class App
    def initialize(dir, log, ruby)
      @dir = dir
      @log = log
      @ruby = ruby
      @rails = MemoryRailsApp.rails_for(ruby.full_version)
      @secret = SecureRandom.hex(64)
    end

    def build
      @rails.rails8? ? new_rails8 : new_rails7
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

    # Production as a deploy without TLS has it; the public file server on. Rails 7.2: force_ssl is
    # on as generated (turned off here) and Action Cable's production adapter is Redis (async here:
    # no Redis in the benchmark). Rails 8.1 with Kamal (the default) writes force_ssl commented
    # out and runs Action Cable on Solid Cable (SQLite): both kept as generated. Each edit is
    # skipped when its result is there already, and raises naming the file and the line it wanted
    # when neither is (a Rails whose files changed must not be measured half-configured).
    def configure_production
      prod = "config/environments/production.rb"
      edit(prod, /^  config\.force_ssl = true$/, done: /^\s*(# ?config\.force_ssl = true|config\.force_ssl = false)$/) do
        "  # The benchmark speaks plain HTTP: no redirect to https.\n  config.force_ssl = false"
      end
      edit(prod, /^end\s*\z/, done: /^  config\.public_file_server\.enabled = true$/) do
        "  # Assets from public/ by the app itself (no nginx in front in the benchmark).\n" \
          "  config.public_file_server.enabled = true\nend\n"
      end
      if @rails.rails8?
        edit("config/cable.yml", nil, done: /^production:\n  adapter: solid_cable$/)
      else
        edit("config/cable.yml", /^production:\n(  .*\n)+/, done: /^production:\n  adapter: async\n\z/) do
          "production:\n  adapter: async\n"
        end
      end
      # the harness's readiness probe asks for / and wants a 200
      edit("config/routes.rb", /^Rails\.application\.routes\.draw do\n/, done: /^  root "posts#index"$/) do |m|
        %(#{m}  root "posts#index"\n)
      end
    end

    # Rails 7.2's database.yml names no production database (DATABASE_URL does); Rails 8.1's
    # names four (primary, cache, queue, cable) in storage/, used as generated.
    def production_env
      env = { "RAILS_ENV" => "production", "RACK_ENV" => "production", "SECRET_KEY_BASE" => @secret }
      return env if @rails.rails8?

      env.merge("RAILS_SERVE_STATIC_FILES" => "1", "DATABASE_URL" => "sqlite3:storage/production.sqlite3")
    end

    private

    # The browser suite's bundle (the gemfile with this Ruby's lockfile, test/matrix.rb), whose
    # railties runs `rails new`.
    def suite_bundle
      { "BUNDLE_GEMFILE" => TestMatrix.gemfile(@rails.gemfile, version: @ruby.full_version[/\A\d+\.\d+/]),
        "BUNDLE_PATH" => @rails.gem_dir }
    end

    # Rails 7.2 (Ruby 3.1): the suite's railties 7.2.4 runs `rails new` without JavaScript (no
    # importmap download) and without the bundle, which is --local below.
    def new_rails7
      run(suite_bundle, "bundle", "exec", "rails", "new", @dir, "--skip-bundle", "--skip-git", "--skip-javascript",
          chdir: File.dirname(@dir))
      bundle
    end

    # Rails 8.1: `rails new` runs every step it runs for a user (bundle, Kamal's files, Solid Cache,
    # Queue and Cable's install) with the browser suite's template: bundle --local from the suite's
    # gem directory, this checkout as the blackbuck gem. Without JavaScript, as the 7.2 app.
    def new_rails8
      run(suite_bundle.merge("BLACKBUCK_ROOT" => ROOT, "BLACKBUCK_APP_GEMS" => @rails.gem_dir),
          "bundle", "exec", "rails", "new", @dir, "-m", RAILS_NEW_TEMPLATE, "--skip-git", "--skip-javascript",
          chdir: File.dirname(@dir))
    end

    # As test/browser/generated_app.rb: no error_highlight line (Ruby 3.1 loads its own before
    # Bundler, which cannot swap a default gem), this checkout as the blackbuck gem, --local.
    def bundle
      gemfile = File.read(path("Gemfile")).lines.reject { |l| l.include?('gem "error_highlight"') }.join
      File.write(path("Gemfile"), "#{gemfile}\ngem \"blackbuck\", path: #{ROOT.inspect}\n")
      run({}, "bundle", "config", "set", "--local", "path", @rails.gem_dir)
      run({}, "bundle", "install", "--local", "--quiet")
    end

    def add_has_many
      children = Hash.new { |h, k| h[k] = [] }
      RESOURCES.each { |model, (_, parents, _)| parents.each { |p| children[p] << model.downcase } }
      children.each do |parent, kids|
        file = "app/models/#{parent}.rb"
        lines = kids.map { |k| "  has_many :#{MemoryRailsApp.plural(k)}, dependent: :destroy\n" }
        edit(file, /^class .*\n/, done: /^#{Regexp.escape(lines.first)}/) { |m| m + lines.join }
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

    # Replaces pattern in rel by the block's text, unless done matches already (the edit's result
    # or what makes it needless). pattern nil: only checks that done matches.
    def edit(rel, pattern, done:, &block)
      MemoryRailsApp.edit_text(rel, File.read(path(rel)), pattern, done: done, &block)&.then { |t| File.write(path(rel), t) }
    end

    def rails(*args, env: {}) = run(env, "bin/rails", *args)

    # Runs cmd to completion in the app (bounded), outside any bundle of the caller, with the
    # Ruby's bin/ first on PATH, raising with its output's tail when it fails.
    def run(env, *cmd, chdir: @dir)
      File.write(@log, "$ #{cmd.join(' ')}\n", mode: "a")
      clean = ENV.to_h.reject { |k, _| k.start_with?("BUNDLE_", "BUNDLER_", "GEM_") || %w[RUBYOPT RUBYLIB].include?(k) }
      clean["PATH"] = [@ruby.bin, clean["PATH"]].compact.join(":")
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
    args = ARGV.dup
    at = args.index("--ruby")
    ruby = MemoryRailsApp.ruby_at(at ? args.slice!(at, 2).last : RbConfig.ruby)
    MemoryRailsApp.generate(File.expand_path(args[0] || MemoryRailsApp.dir_for(ruby.full_version)), ruby)
  rescue StandardError => e
    warn "memory_rails: #{e.message}"
    exit 1
  end
end
