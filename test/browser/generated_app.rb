# frozen_string_literal: true

require "securerandom"
require "digest"
require "yaml"

# A Rails app made at test time the way a user makes one: `rails new` with its defaults, bundled
# (--local) from the suite's own gem directory (bin/setup installs gemfiles/browser.gemfile there
# for Ruby 3.1, gemfiles/browser8.gemfile for Ruby >= 3.2), then only a scaffold, a channel, a job,
# a page with a download and a job button, and an ActionController::Live stream of Turbo Streams
# with its pages (fixtures/) added, Active Support's isolation level taken from ISOLATION_LEVEL
# when set, and readied for production as a deploy does (database prepared, assets precompiled).
# Nothing generated is kept in git.
# The Rails version is the suite's (the gemfile rake test:browser chose):
# - Rails 7.2: importmap, Turbo, Stimulus, Sprockets, SQLite; Action Cable's production adapter is
#   Redis (cable.yml as generated, REDIS_URL from the suite's redis-server), so the Gemfile's
#   commented `gem "redis"` is enabled as Rails' guide says; force_ssl is on, so one edit
#   (#configure_production); jobs on the async adapter.
# - Rails 8: importmap, Turbo, Stimulus, Propshaft, Solid Cache, Solid Queue and Solid Cable on
#   SQLite, Thruster, Kamal's files; production runs as generated (force_ssl is commented out,
#   cable.yml uses Solid Cable), with the master key a Kamal deploy passes in RAILS_MASTER_KEY.
class GeneratedApp
  # The suite's gem directory: rake test:browser runs the suite with BUNDLE_PATH set to it.
  GEM_DIR = ENV.fetch("BUNDLE_PATH", nil)
  RAILS = Gem.loaded_specs["railties"]&.version || Gem::Version.new("0") # the suite's bundle's
  TEMPLATE = File.join(__dir__, "rails_new_template.rb")
  FIXTURES = File.join(__dir__, "fixtures")
  DOWNLOAD_BYTES = 8 * 1024 * 1024
  STEP_TIMEOUT = 300 # seconds: a bound for one generator or bundler run that went wrong

  def self.gems_installed? = GEM_DIR && Dir.exist?(GEM_DIR)

  attr_reader :dir, :download_sha256

  def self.rails8? = RAILS >= Gem::Version.new("8")

  def initialize(parent)
    @dir = File.join(parent, "app")
    @secret_key_base = SecureRandom.hex(64)
  end

  # Builds the app; returns self.
  def generate
    GeneratedApp.rails8? ? new_rails8 : new_rails7
    rails("generate", "scaffold", "Note", "title:string", "body:text")
    rails("generate", "channel", "Ping")
    rails("generate", "job", "Stamp")
    add_fixtures
    rails("db:prepare")
    # What a deploy does before the server starts (Rails 8's Dockerfile precompiles the assets, its
    # bin/docker-entrypoint runs db:prepare; the Dockerfile test runs that entrypoint again).
    rails("db:prepare", "assets:precompile", env: production_env)
    self
  end

  # RAILS_ENV=production and what production needs from its environment. Rails 7.2: a secret and,
  # since its database.yml names no production database, DATABASE_URL. Rails 8: the master key,
  # as Kamal's generated .kamal/secrets reads it from config/master.key and config/deploy.yml
  # passes it (env.secret), and deploy.yml's clear env (SOLID_QUEUE_IN_PUMA: true: the server
  # runs Solid Queue's bin/jobs).
  def production_env
    return { "RAILS_ENV" => "production", "SECRET_KEY_BASE" => @secret_key_base, "DATABASE_URL" => "sqlite3:storage/production.sqlite3" } unless GeneratedApp.rails8?

    { "RAILS_ENV" => "production", "RAILS_MASTER_KEY" => File.read(path("config/master.key")).strip, **kamal_clear_env }
  end

  # config/deploy.yml's `env: clear:` (Rails 8), as strings.
  def kamal_clear_env
    YAML.safe_load_file(path("config/deploy.yml")).dig("env", "clear").to_h { |k, v| [k, v.to_s] }
  end

  # Starts cmd in the app's directory, outside the suite's bundle (the app has its own).
  def spawn(cmd, log_path:, env: {})
    unbundled { ChildProcess.new(cmd, log_path: log_path, env: own_bundle.merge(env), chdir: @dir) }
  end

  def path(relative) = File.join(@dir, relative)

  private

  # Rails 7.2: `rails new --skip-bundle`, then the steps it skipped: bundle (#bundle) and what it
  # runs after bundling (Rails::Generators::AppBase#run_javascript, #run_hotwire).
  def new_rails7
    run(RbConfig.ruby, Gem.bin_path("railties", "rails"), "new", @dir, "--skip-bundle", "--skip-git", chdir: File.dirname(@dir))
    bundle
    rails("importmap:install", "turbo:install", "stimulus:install")
    configure_production
  end

  # Rails 8: `rails new` runs every step itself (bundle, importmap, Hotwire, Kamal, Solid), in the
  # suite's bundle, its bundler pointed at the suite's gem directory by rails_new_template.rb.
  def new_rails8
    run(RbConfig.ruby, Gem.bin_path("railties", "rails"), "new", @dir, "-m", TEMPLATE, "--skip-git",
        env: { "BLACKBUCK_ROOT" => ROOT, "BLACKBUCK_APP_GEMS" => GEM_DIR }, chdir: File.dirname(@dir), in_bundle: :suite)
    run("bundle", "binstubs", "blackbuck")
  end

  def log_path = File.join(File.dirname(@dir), "generate.log")

  # As README says: the app's Gemfile names blackbuck (this checkout), then `bundle install` and
  # `bundle binstubs blackbuck`. --local: from the suite's gem directory only, no network.
  def bundle
    gemfile = File.read(path("Gemfile"))
    # Rails adds error_highlight for Ruby < 3.2, but Ruby 3.1 loads its own copy before Bundler
    # runs and Bundler 2.3 (Debian 12's) cannot swap a default gem: every bin/rails would stop.
    gemfile = gemfile.lines.reject { |l| l.include?('gem "error_highlight"') }.join
    # "Use Redis adapter to run Action Cable in production": the line Rails writes commented out
    gemfile = gemfile.sub(/^# (gem "redis".*)$/, '\1')
    raise "the generated Gemfile has no gem \"redis\" line to enable:\n#{gemfile}" unless gemfile.match?(/^gem "redis"/)
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
      %(#{m}  get "demo" => "demo#show"\n  get "download" => "demo#download"\n  post "demo/job" => "demo#job"\n) +
        %(  get "stream" => "streams#show"\n  get "stream/events" => "streams#events"\n  get "stream/plain" => "streams#plain"\n)
    end
    # docs/CONFIGURATION.md, streams: "a Rails app that turns it on sets isolation_level = :fiber".
    # The suite's streams tests do (ISOLATION_LEVEL=fiber); the others run the app as generated.
    edit("config/application.rb", /^    config\.load_defaults [\d.]+\n/) do |m|
      %(#{m}    config.active_support.isolation_level = ENV["ISOLATION_LEVEL"].to_sym if ENV["ISOLATION_LEVEL"]\n)
    end
    data = Random.new(22).bytes(DOWNLOAD_BYTES)
    File.binwrite(path("storage/download.bin"), data)
    @download_sha256 = Digest::SHA256.hexdigest(data)
  end

  # The edit a user without TLS makes to run the default Rails 7.2 app in production (Rails 8
  # needs none). cable.yml stays as generated: Redis at REDIS_URL.
  def configure_production
    edit("config/environments/production.rb", /^  config\.force_ssl = true$/) do
      "  # The suite's nginx and HAProxy speak plain HTTP (no certificate): no redirect to https.\n  config.force_ssl = false"
    end
  end

  def edit(relative, pattern, &block)
    text = File.read(path(relative))
    raise "#{relative} has no #{pattern.inspect}:\n#{text}" unless text.match?(pattern)

    File.write(path(relative), text.sub(pattern, &block))
  end

  def rails(*args, env: {}) = run("bin/rails", *args, env: env)

  # Runs cmd to completion (bounded), raising with its output when it fails. In the app's own
  # bundle, or with in_bundle: :suite in the suite's (the environment rake test:browser gave it).
  def run(*cmd, env: {}, chdir: @dir, in_bundle: :app)
    File.write(log_path, "$ #{cmd.join(' ')}\n", mode: "a")
    opts = { chdir: chdir, out: [log_path, "a"], err: %i[child out], pgroup: true }
    pid = in_bundle == :suite ? Process.spawn(env, *cmd, **opts) : unbundled { Process.spawn(own_bundle.merge(env), *cmd, **opts) }
    status = wait(pid)
    raise "#{cmd.join(' ')} failed (#{status.inspect}):\n#{File.read(log_path).lines.last(40).join}" unless status&.success?
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
