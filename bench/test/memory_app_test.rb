# frozen_string_literal: true

# The memory workload on the servers' Ruby (issue 34): which Rails its generated app is made with
# and where, the production edits on each Rails's files (idempotent, loud when a line is missing),
# and its rows on 3.4 (every peer there, with and without jemalloc and YJIT) with their settings.
# No Rails, no servers: the edits run on small copies of the generated files.
# Run: ruby bench/test/memory_app_test.rb   (or rake bench:test)
require "minitest/autorun"
require "tmpdir"
require_relative "fake_rubies"
require_relative "../lib/blackbuck_bench/runner"

class MemoryAppTest < Minitest::Test
  include BlackbuckBench
  include FakeRubies

  # --- which Rails, where ---

  def test_rails_81_on_ruby_32_and_later_72_on_31
    assert_equal "8.1.3", MemoryRailsApp.rails_for("3.4.9").version
    assert_equal "8.1.3", MemoryRailsApp.rails_for("4.0.1").version
    assert_equal "8.1.3", MemoryRailsApp.rails_for("3.2.0").version, "Rails 8 needs 3.2"
    assert_equal "7.2.4", MemoryRailsApp.rails_for("3.1.2").version
    assert_equal "gemfiles/browser8.gemfile", MemoryRailsApp.rails_for("3.4.9").gemfile
    assert_equal MemoryRailsApp::GEM_DIR8, MemoryRailsApp.gem_dir(RUBY_34)
    assert_equal MemoryRailsApp::GEM_DIR, MemoryRailsApp.gem_dir(DEBIAN_31)
    assert_equal File.join(MemoryRailsApp::GEM_DIR8, "ruby", "4.0.0"), MemoryRailsApp.abi_gem_dir(RUBY_40)
  end

  def test_one_app_directory_per_ruby
    assert_match(%r{/tmp/bench-rails-memory-3\.4\z}, MemoryRailsApp.dir_for("3.4.9"))
    assert_match(%r{/tmp/bench-rails-memory-3\.1\z}, MemoryRailsApp.dir_for("3.1.2"))
    skip "BENCH_MEMORY_APP names the app" if ENV["BENCH_MEMORY_APP"]

    with_server_ruby(RUBY_34) do
      assert_equal MemoryRailsApp.dir_for("3.4.9"), Servers.memory_app_dir
      assert_equal File.join(MemoryRailsApp.dir_for("3.4.9"), "config.ru"), BlackbuckBench.workload("memory").app_path
    end
    with_server_ruby(DEBIAN_31) { assert_equal MemoryRailsApp.dir_for("3.1.2"), Servers.memory_app_dir }
  end

  def test_a_ruby_without_its_rails_gems_is_named_in_the_reason
    ruby = FakeRubies.ruby("9.9")
    why = MemoryRailsApp.missing_gems(ruby)
    assert_match(%r{no Rails 8\.1\.3 gems for Ruby 9\.9\.9 in .*/ruby/9\.9\.0 \(bin/setup installs gemfiles/browser8\.gemfile}, why)
    e = assert_raises(RuntimeError) { MemoryRailsApp.generate(File.join(Dir.tmpdir, "never-made"), ruby) }
    assert_equal why, e.message
  end

  def test_the_peers_resolve_rails_from_the_rubys_own_gem_directory
    with_server_ruby(RUBY_34) do
      Dir.mktmpdir do |app|
        File.write(File.join(app, MemoryRailsApp::ENV_FILE), '{"RAILS_ENV":"production"}')
        env = MemoryStep.env(Servers.fetch("itsi-4x1-jemalloc"), app)
        assert_equal [RUBY_34.gem_home, File.join(MemoryRailsApp::GEM_DIR8, "ruby", "3.4.0"), "/opt/gems/3.4"],
                     env["GEM_PATH"].split(":")
        assert_equal Servers::JEMALLOC, env["LD_PRELOAD"]
        assert_equal "production", env["RAILS_ENV"]
        bundled = MemoryStep.env(Servers.fetch("blackbuck-defaults"), app)
        assert_equal File.join(app, "Gemfile"), bundled["BUNDLE_GEMFILE"], "Blackbuck in the app's own bundle"
        assert_equal RUBY_34.bin, bundled["PATH"].split(":").first
      end
    end
  end

  # --- the production edits ---

  RAILS8_PRODUCTION = <<~RUBY
    Rails.application.configure do
      # Assume all access to the app is happening through a SSL-terminating reverse proxy.
      # config.assume_ssl = true

      # Force all access to the app over SSL, use Strict-Transport-Security, and use secure cookies.
      # config.force_ssl = true
    end
  RUBY

  RAILS7_PRODUCTION = <<~RUBY
    Rails.application.configure do
      # Force all access to the app over SSL, use Strict-Transport-Security, and use secure cookies.
      config.force_ssl = true
    end
  RUBY

  ROUTES = "Rails.application.routes.draw do\n  resources :posts\nend\n"
  CABLE8 = "production:\n  adapter: solid_cable\n  connects_to:\n    database:\n      writing: cable\n"
  CABLE7 = "development:\n  adapter: async\n\nproduction:\n  adapter: redis\n  url: redis://localhost:6379/1\n  channel_prefix: app_production\n"

  def with_app(ruby, production, cable)
    Dir.mktmpdir do |dir|
      FileUtils.mkdir_p(File.join(dir, "config/environments"))
      File.write(File.join(dir, "config/environments/production.rb"), production)
      File.write(File.join(dir, "config/cable.yml"), cable)
      File.write(File.join(dir, "config/routes.rb"), ROUTES)
      yield MemoryRailsApp::App.new(dir, File.join(dir, "log"), ruby), dir
    end
  end

  def files(dir) = %w[config/environments/production.rb config/cable.yml config/routes.rb].to_h { |f| [f, File.read(File.join(dir, f))] }

  def test_rails8_production_keeps_force_ssl_and_solid_cable_as_generated_and_runs_twice_alike
    with_app(RUBY_34, RAILS8_PRODUCTION, CABLE8) do |app, dir|
      app.configure_production
      after = files(dir)
      assert_match(/^  # config\.force_ssl = true$/, after["config/environments/production.rb"], "commented out already: left so")
      refute_match(/config\.force_ssl = false/, after["config/environments/production.rb"])
      assert_match(/^  config\.public_file_server\.enabled = true\nend\n\z/, after["config/environments/production.rb"])
      assert_equal CABLE8, after["config/cable.yml"]
      assert_match(/^  root "posts#index"$/, after["config/routes.rb"])
      app.configure_production
      assert_equal after, files(dir), "a second run changes nothing"
      refute app.production_env.key?("DATABASE_URL"), "Rails 8.1's database.yml names its four databases"
    end
  end

  def test_rails7_production_turns_force_ssl_off_and_cable_to_async_and_runs_twice_alike
    with_app(DEBIAN_31, RAILS7_PRODUCTION, CABLE7) do |app, dir|
      app.configure_production
      after = files(dir)
      assert_match(/^  config\.force_ssl = false$/, after["config/environments/production.rb"])
      assert_match(/^production:\n  adapter: async\n\z/, after["config/cable.yml"])
      app.configure_production
      assert_equal after, files(dir), "a second run changes nothing"
      assert_equal "sqlite3:storage/production.sqlite3", app.production_env["DATABASE_URL"]
    end
  end

  def test_a_missing_line_fails_with_the_file_and_the_line
    with_app(RUBY_34, "Rails.application.configure do\nend\n", CABLE8) do |app, _|
      e = assert_raises(RuntimeError) { app.configure_production }
      assert_match(%r{config/environments/production\.rb: neither .*force_ssl = true.* \(to edit\) nor .* \(done already\)}, e.message)
    end
    with_app(RUBY_34, RAILS8_PRODUCTION, "production:\n  adapter: redis\n") do |app, _|
      e = assert_raises(RuntimeError) { app.configure_production }
      assert_match(%r{config/cable\.yml: no .*solid_cable.* \(as generated\)}, e.message)
    end
  end

  # --- the rows on 3.4 ---

  NEW_PEERS = %w[pitchfork-no-refork itsi-4x1 falcon-count4].freeze
  BEFORE = %w[blackbuck-defaults blackbuck-warmup blackbuck-refork blackbuck-warmup-refork pitchfork-refork
              puma8-preload puma8-fork-worker unicorn-preload iodine-4x1].freeze

  def memory_rows(ruby)
    opts = BlackbuckBench.parse_options(%w[--workloads memory], env: {}).merge(server_ruby: ruby)
    Plan.build(opts).first.servers
  end

  def test_every_peer_on_34_has_a_memory_row_with_and_without_jemalloc_and_yjit
    rows = memory_rows(RUBY_34)
    (NEW_PEERS + BEFORE).each do |name|
      jemalloc = name == "blackbuck-defaults" ? "blackbuck-defaults-jemalloc" : "#{name}-jemalloc"
      [name, "#{name}+yjit", jemalloc, "#{jemalloc}+yjit"].each { |row| assert_includes rows, row }
    end
    assert_equal 51, rows.size, "17 configurations x jemalloc x YJIT, and three with YJIT's 64 MiB code region"
  end

  def test_the_new_rows_settings
    with_server_ruby(RUBY_34) do
      assert_equal Servers::JEMALLOC, Servers.fetch("falcon-count4-jemalloc+yjit").env["LD_PRELOAD"]
      assert_equal "--yjit", Servers.fetch("falcon-count4-jemalloc+yjit").env["RUBYOPT"]
      assert_nil Servers.fetch("pitchfork-no-refork").env["LD_PRELOAD"]
      Dir.mktmpdir do |dir|
        ctx = LaunchContext.new(app_name: "memory_rails", app_path: File.join(Servers.memory_app_dir, "config.ru"),
                                workers: 4, tcp_port: 4000, unix_path: "/tmp/m.sock", dir: dir, root: "/root")
        pitchfork = Servers.fetch("pitchfork-no-refork").command(ctx)
        assert_equal Servers.memory_app_dir, pitchfork[:chdir]
        conf = File.read(File.join(dir, "pitchfork.conf.rb"))
        assert_match(/worker_processes 4/, conf)
        refute_match(/refork_after/, conf, "Pitchfork as it runs by default")
        itsi = Servers.fetch("itsi-4x1").command(ctx)
        assert_equal Servers.memory_app_dir, itsi[:chdir]
        assert_match(/workers 4\nthreads 1\npreload true/, File.read(File.join(dir, "Itsi.rb")))
        falcon = Servers.fetch("falcon-count4").command(ctx)
        assert_equal Servers.memory_app_dir, falcon[:chdir]
        assert_equal "host", falcon[:argv][1]
        conf = File.read(File.join(dir, "falcon.rb"))
        assert_match(/count 4\n\s+preload \[".*preload\.rb"\]/, conf)
        assert_match(%r{require ".*/config/environment"}, File.read(File.join(dir, "preload.rb")), "the app before the fork")
      end
    end
  end

  def test_the_memory_estimate_on_34
    opts = BlackbuckBench.parse_options(%w[--workloads memory], env: {}).merge(server_ruby: RUBY_34)
    est = Plan.estimate(Plan.build(opts), opts, present: ->(_) { true })
    assert_equal 51 * Plan::MEMORY_ROW_S, est[:memory_seconds]
    assert_operator est[:memory_seconds], :<, Plan::MEMORY_BUDGET_S
  end
end
