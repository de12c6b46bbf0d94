# frozen_string_literal: true

require "securerandom"
require "digest"

# A Rails app made at test time the way a user makes one: `rails new` with its defaults (importmap,
# Turbo, Stimulus, Action Cable, Sprockets, SQLite), bundled (--local) from the suite's own gem
# directory (bin/setup installs gemfiles/browser.gemfile there), then only a scaffold, a channel and
# a page with a download (fixtures/) added, and readied for production as a deploy does (database
# migrated, assets precompiled). Nothing generated is kept in git.
class GeneratedApp
  # The suite's gem directory: rake test:browser runs the suite with BUNDLE_PATH set to it.
  GEM_DIR = ENV.fetch("BUNDLE_PATH", nil)
  FIXTURES = File.join(__dir__, "fixtures")
  DOWNLOAD_BYTES = 8 * 1024 * 1024
  STEP_TIMEOUT = 300 # seconds: a bound for one generator or bundler run that went wrong

  def self.gems_installed? = GEM_DIR && Dir.exist?(GEM_DIR)

  attr_reader :dir, :download_sha256, :secret_key_base

  def initialize(parent)
    @dir = File.join(parent, "app")
    @secret_key_base = SecureRandom.hex(64)
  end

  # Builds the app; returns self.
  def generate
    run(RbConfig.ruby, Gem.bin_path("railties", "rails"), "new", @dir, "--skip-bundle", "--skip-git", chdir: File.dirname(@dir))
    bundle
    # what `rails new` runs after bundling (Rails::Generators::AppBase#run_javascript, #run_hotwire)
    rails("importmap:install", "turbo:install", "stimulus:install")
    rails("generate", "scaffold", "Note", "title:string", "body:text")
    rails("generate", "channel", "Ping")
    add_fixtures
    configure_production
    rails("db:prepare")
    rails("db:prepare", "assets:precompile", env: production_env)
    self
  end

  # RAILS_ENV=production and what production needs from its environment (Rails 7.2's database.yml
  # names no production database: a deploy gives DATABASE_URL).
  def production_env
    { "RAILS_ENV" => "production", "SECRET_KEY_BASE" => @secret_key_base, "DATABASE_URL" => "sqlite3:storage/production.sqlite3" }
  end

  # Starts cmd in the app's directory, outside the suite's bundle (the app has its own).
  def spawn(cmd, log_path:, env: {})
    unbundled { ChildProcess.new(cmd, log_path: log_path, env: own_bundle.merge(env), chdir: @dir) }
  end

  def path(relative) = File.join(@dir, relative)

  private

  # As README says: the app's Gemfile names blackbuck (this checkout), then `bundle install` and
  # `bundle binstubs blackbuck`. --local: from the suite's gem directory only, no network.
  def bundle
    gemfile = File.read(path("Gemfile"))
    # Rails adds error_highlight for Ruby < 3.2, but Ruby 3.1 loads its own copy before Bundler
    # runs and Bundler 2.3 (Debian 12's) cannot swap a default gem: every bin/rails would stop.
    gemfile = gemfile.lines.reject { |l| l.include?('gem "error_highlight"') }.join
    File.write(path("Gemfile"), "#{gemfile}\ngem \"blackbuck\", path: #{ROOT.inspect}\n")
    run("bundle", "config", "set", "--local", "path", GEM_DIR)
    run("bundle", "install", "--local", "--quiet")
    run("bundle", "binstubs", "blackbuck")
  end

  def add_fixtures
    Dir.glob("**/*", base: FIXTURES).each do |rel|
      src = File.join(FIXTURES, rel)
      next if File.directory?(src)

      FileUtils.mkdir_p(File.dirname(path(rel)))
      FileUtils.cp(src, path(rel))
    end
    edit("config/routes.rb", /^Rails\.application\.routes\.draw do\n/) do |m|
      %(#{m}  get "demo" => "demo#show"\n  get "download" => "demo#download"\n)
    end
    data = Random.new(22).bytes(DOWNLOAD_BYTES)
    File.binwrite(path("storage/download.bin"), data)
    @download_sha256 = Digest::SHA256.hexdigest(data)
  end

  # Two edits a user without TLS and without Redis makes to run the default app in production.
  def configure_production
    edit("config/environments/production.rb", /^  config\.force_ssl = true$/) do
      "  # The suite's nginx and HAProxy speak plain HTTP (no certificate): no redirect to https.\n  config.force_ssl = false"
    end
    edit("config/cable.yml", /^production:\n(  .*\n)+/) do
      "production:\n  # No Redis here: the in-process adapter (a broadcast reaches the subscribers of its own worker).\n  adapter: async\n"
    end
  end

  def edit(relative, pattern, &block)
    text = File.read(path(relative))
    raise "#{relative} has no #{pattern.inspect}:\n#{text}" unless text.match?(pattern)

    File.write(path(relative), text.sub(pattern, &block))
  end

  def rails(*args, env: {}) = run("bin/rails", *args, env: env)

  # Runs cmd to completion (bounded), raising with its output when it fails.
  def run(*cmd, env: {}, chdir: @dir)
    log = File.join(File.dirname(@dir), "generate.log")
    File.write(log, "$ #{cmd.join(' ')}\n", mode: "a")
    pid = unbundled { Process.spawn(own_bundle.merge(env), *cmd, chdir: chdir, out: [log, "a"], err: %i[child out], pgroup: true) }
    status = wait(pid)
    raise "#{cmd.join(' ')} failed (#{status.inspect}):\n#{File.read(log).lines.last(40).join}" unless status&.success?
  end

  def wait(pid)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STEP_TIMEOUT
    loop do
      _, status = Process.waitpid2(pid, Process::WNOHANG)
      return status if status
      break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
    Process.kill(:KILL, -pid)
    Process.waitpid(pid)
    nil
  end

  # The environment without the suite's bundle (RUBYOPT=-rbundler/setup, ...: what `bundle exec`
  # added), and without what rake test:browser set before it (BUNDLE_GEMFILE, BUNDLE_PATH): the
  # app's own Gemfile, with the path its .bundle/config names.
  def unbundled(&block) = defined?(Bundler) ? Bundler.with_unbundled_env(&block) : yield
  def own_bundle = { "BUNDLE_GEMFILE" => path("Gemfile"), "BUNDLE_PATH" => nil }
end
