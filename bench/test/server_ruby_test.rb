# frozen_string_literal: true

# The servers' Ruby (issue 34): which Ruby a run's servers use and how it is chosen, where each
# Ruby's peers are installed, and the plan on Ruby 3.4 (YJIT by default, every peer there named with
# its settings) against the one on Debian's 3.1. No servers, no load.
# Run: ruby bench/test/server_ruby_test.rb   (or rake bench:test)
require "minitest/autorun"
require "rbconfig"
require_relative "fake_rubies"
require_relative "../lib/blackbuck_bench/runner"

class ServerRubyTest < Minitest::Test
  include BlackbuckBench
  include FakeRubies

  def plan(ruby, *args)
    opts = BlackbuckBench.parse_options(args, env: {}).merge(server_ruby: ruby)
    Plan.build(opts).to_h { |s| [s.workload.name, s] }
  end

  # --- choosing the Ruby ---

  def test_a_full_run_defaults_to_34_quick_to_the_running_ruby_and_bench_ruby_or_ruby_wins
    assert_equal "3.4", BlackbuckBench.parse_options([], env: {})[:ruby]
    assert_equal "current", BlackbuckBench.parse_options(%w[--quick], env: {})[:ruby], "CI lanes: each its own Ruby"
    assert_equal "4.0", BlackbuckBench.parse_options([], env: { "BENCH_RUBY" => "4.0" })[:ruby]
    assert_equal "3.1", BlackbuckBench.parse_options(%w[--quick], env: { "BENCH_RUBY" => "3.1" })[:ruby]
    assert_equal "3.1", BlackbuckBench.parse_options(%w[--ruby 3.1], env: { "BENCH_RUBY" => "4.0" })[:ruby], "the flag wins"
  end

  def test_find_bin_takes_current_a_path_or_a_matrix_version
    here = File.dirname(RbConfig.ruby)
    assert_equal here, ServerRuby.find_bin("current")
    assert_equal here, ServerRuby.find_bin(RbConfig.ruby), "a ruby executable"
    assert_equal here, ServerRuby.find_bin(here), "its bin/ directory"
    e = assert_raises(ArgumentError) { ServerRuby.find_bin("2.7") }
    assert_match(/not a Ruby of test\/matrix\.rb/, e.message)
    assert_raises(ArgumentError) { ServerRuby.find_bin("/nonexistent/bin") }
  end

  def test_each_ruby_has_its_own_gem_directory_and_defaults
    assert_equal File.join(ServerRuby::GEM_ROOT, "3.4"), RUBY_34.gem_home unless ENV["BENCH_GEM_HOME"]
    refute_equal RUBY_34.gem_home, DEBIAN_31.gem_home unless ENV["BENCH_GEM_HOME"]
    assert RUBY_34.yjit_by_default? && RUBY_40.yjit_by_default?
    refute DEBIAN_31.yjit_by_default?
    assert DEBIAN_31.debian? && !RUBY_34.debian?
    assert RUBY_34.mn_threads? && !DEBIAN_31.mn_threads?
    assert_equal "BENCH_RUBY=3.4 bench/setup", RUBY_34.setup_hint
  end

  def test_server_env_puts_the_ruby_and_its_gems_first
    with_server_ruby(RUBY_34) do
      env = Machine.server_env(bundled: false)
      assert_equal [RUBY_34.gem_home, "/opt/gems/3.4"], env["GEM_PATH"].split(":")
      assert_equal [File.join(RUBY_34.gem_home, "bin"), RUBY_34.bin], env["PATH"].split(":").first(2)
      bundled = Machine.server_env(bundled: true)
      assert_equal RUBY_34.bin, bundled["PATH"].split(":").first, "bundle exec and exe/blackbuck's `env ruby` find 3.4"
      assert_equal File.join(RUBY_34.bin, "bundle"), Servers.blackbuck_command(ctx, exe: "exe/blackbuck")[:argv].first
    end
  end

  def ctx
    LaunchContext.new(app_name: "hello_length", app_path: "/app.ru", workers: 2, tcp_port: 4000,
                      unix_path: "/tmp/s.sock", dir: Dir.tmpdir, root: "/root")
  end

  # --- the plan on 3.4 ---

  def test_on_34_yjit_rows_run_everywhere_and_rows_without_it_only_where_compared
    steps = plan(RUBY_34)
    hello = steps["hello_length"].servers
    %w[blackbuck+yjit unicorn+yjit puma8-2x1+yjit puma8-2x3-mn+yjit puma8-2x5-mn+yjit pitchfork+yjit iodine-2x1+yjit
       itsi-2x1+yjit falcon+yjit nginx].each { |n| assert_includes hello, n }
    assert_includes hello, "blackbuck", "the comparison without YJIT on hello world"
    assert_includes steps["rails"].servers, "puma8-2x3"
    refute_includes steps["big"].servers, "blackbuck", "no row without YJIT where it is not compared"
    refute_includes steps["mixed"].servers, "blackbuck"
    assert_includes steps["mixed"].servers, "blackbuck-2x2+yjit", "the threaded rows' twins run on 3.4"
    assert_includes steps["iowait"].servers, "puma8-2x5-mn+yjit", "the issue's yardstick for --threads 5"
    refute steps.values.flat_map(&:servers).any? { |n| n.start_with?("puma5") }, "Debian's Puma 5.6 is for 3.1"
  end

  def test_on_31_the_plan_is_the_one_before_issue_34
    steps = plan(DEBIAN_31)
    all = steps.values.flat_map(&:servers)
    assert_includes all, "puma5"
    refute all.any? { |n| n.include?("-mn") }, "M:N threads need 3.3"
    refute_includes steps["mixed"].servers, "blackbuck-2x2+yjit"
    assert_includes steps["mixed"].servers, "blackbuck"
    assert_includes steps["big"].servers, "blackbuck+yjit"
  end

  def test_quick_on_34_measures_the_rows_without_yjit_in_one_cell
    step = plan(RUBY_34, "--quick")["hello_length"]
    assert_equal step.cells, step.cells_for("blackbuck+yjit")
    assert_equal step.cells.first(1), step.cells_for("blackbuck")
    assert_equal step.cells, step.cells_for("nginx")
  end

  def test_a_named_server_unfit_for_the_ruby_is_absent_with_the_reason
    assert_includes plan(RUBY_34, "--servers", "puma5,blackbuck")["hello_length"].servers, "puma5"
    assert_match(/Debian's package is built for Debian's Ruby 3\.1/, Servers.fetch("puma5").absent_reason(RUBY_34))
    assert_match(/M:N threads\) needs Ruby >= 3\.3/, Servers.fetch("puma8-2x5-mn").absent_reason(DEBIAN_31))
  end

  # --- every peer on 3.4, named with its settings ---

  def test_peers_on_34_say_how_they_run
    with_server_ruby(RUBY_34) do
      assert_match(/RUBY_MN_THREADS=1/, Servers.fetch("puma8-2x5-mn").summary)
      assert_equal "1", Servers.fetch("puma8-2x5-mn").env["RUBY_MN_THREADS"]
      assert_equal "1", Servers.fetch("iodine-2x1").env["RUBY_MN_THREADS"], "HttpArena's Iodine: 1 thread, M:N"
      assert_match(/Iodine 0\.8 .*-t 1 --preload -R, RUBY_MN_THREADS=1/, Servers.fetch("iodine-2x1").summary)
      assert_empty Servers.fetch("iodine-2x5").env
      assert_match(/unicorn 6\.1 \(RubyGems\)/, Servers.fetch("unicorn").summary)
      assert_match(/falcon host/, Servers.fetch("falcon").summary)
      assert_equal "1", Servers.fetch("falcon+yjit").env["RUBY_YJIT_ENABLE"]
      assert_match(/RUBY_YJIT_ENABLE=1/, Servers.fetch("puma8-2x5-mn+yjit").summary)
      assert_equal "1", Servers.fetch("puma8-2x5-mn+yjit").env["RUBY_MN_THREADS"], "the twin keeps M:N"
    end
    with_server_ruby(DEBIAN_31) do
      assert_empty Servers.fetch("iodine-2x1").env, "Ruby 3.1 has no M:N threads"
      assert_match(/Iodine 0\.7/, Servers.fetch("iodine-2x1").summary)
      assert_match(/Debian unicorn 6\.0/, Servers.fetch("unicorn").summary)
    end
  end

  def test_iodine_08_binds_a_url_and_preloads
    with_server_ruby(RUBY_34) do
      Dir.mktmpdir do |dir|
        c = ctx.dup.tap { |x| x.dir = dir }
        argv = Servers.iodine_command(c, 1)[:argv]
        assert_equal %w[-w 2 -t 1 -b http://127.0.0.1:4000 --preload -R], argv[1..8]
        assert_match(/Iodine\.listen\(service: :http, handler: app, url: "unix:\/\/\/tmp\/s\.sock"\)/, File.read(File.join(dir, "iodine.ru")))
      end
    end
  end

  def test_falcon_binds_both_listeners_with_one_composite_endpoint
    text = Servers.falcon_config(ctx)
    assert_match(/include Falcon::Environment::Rack/, text)
    assert_match(/count 2/, text)
    assert_match(/IO::Endpoint\.tcp\("127\.0\.0\.1", 4000/, text)
    assert_match(/IO::Endpoint\.unix\("\/tmp\/s\.sock"/, text)
  end

  def test_rails_stack_follows_the_ruby
    old = RailsStack.for(DEBIAN_31)
    assert_match(/rails61\.gemfile\z/, old.gemfile)
    assert_match(/rack2\.rb\z/, old.preload)
    new = RailsStack.for(RUBY_34)
    assert_match(%r{tmp/gemfiles/ruby-3\.4/rails8\.gemfile\z}, new.gemfile)
    assert_match(/rack31\.rb\z/, new.preload)
    assert_equal "8.1.3", new.env["BENCH_RAILS"]
  end

  # --- the memory rows: every server with and without jemalloc, each with and without YJIT ---

  def test_memory_rows_have_jemalloc_and_yjit_for_every_server
    names = Servers::MEMORY.map(&:name)
    Servers::MEMORY_ALLOC.reject { |r| r.name.include?("jemalloc") }.each do |r|
      jemalloc = r.name == "blackbuck-defaults" ? "blackbuck-defaults-jemalloc" : "#{r.name}-jemalloc"
      assert_includes names, jemalloc
      assert_includes names, "#{jemalloc}+yjit"
      assert_includes names, "#{r.name}+yjit"
    end
    with_server_ruby(RUBY_34) do
      assert_equal "--yjit", Servers.fetch("puma8-preload+yjit").env["RUBYOPT"], "3.4: YJIT's own limits"
      assert_equal Servers::JEMALLOC, Servers.fetch("unicorn-preload-jemalloc+yjit").env["LD_PRELOAD"]
      assert_equal "--yjit --yjit-exec-mem-size=64", Servers.fetch("blackbuck-warmup-refork+yjit64").env["RUBYOPT"]
    end
    with_server_ruby(DEBIAN_31) do
      assert_equal "--yjit --yjit-exec-mem-size=256", Servers.fetch("puma8-preload+yjit").env["RUBYOPT"]
    end
  end

  def test_full_run_on_34_fits_an_hour_plus_the_memory_rows
    opts = BlackbuckBench.parse_options([], env: {}).merge(server_ruby: RUBY_34)
    est = Plan.estimate(Plan.build(opts), opts, present: ->(_) { true })
    assert_operator est[:seconds] - est[:memory_seconds], :<, Plan::FULL_RUN_BUDGET_S
    assert_operator est[:memory_seconds], :<, Plan::MEMORY_BUDGET_S
  end
end
