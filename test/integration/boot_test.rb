# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# Booting an app: errors say where they come from (one line; the whole story with --debug),
# the environment falls back to RAILS_ENV, and config/blackbuck.rb is read when present.
class BootTest < ServerTest
  def run_cli(*args, chdir: ROOT, env: {})
    Open3.capture3({ "BLACKBUCK_DEBUG" => nil }.merge(env), RbConfig.ruby, EXE, *args, chdir: chdir)
  end

  # An app whose config.ru loads an initializer that raises on its line 2 (as a Rails app's
  # config/environment.rb runs config/initializers/*.rb).
  def with_failing_app(message = "boom in an initializer")
    Dir.mktmpdir("bb-test") do |d|
      FileUtils.mkdir_p("#{d}/config/initializers")
      File.write("#{d}/config/initializers/boom.rb", "# an initializer\nraise #{message.inspect}\n")
      File.write("#{d}/config.ru", "require_relative 'config/initializers/boom'\nrun ->(_env) { [200, {}, []] }\n")
      yield d
    end
  end

  def test_boot_error_names_the_line_that_raised_in_one_line
    with_failing_app do |d|
      _o, err, status = run_cli("-l", "127.0.0.1:0", "#{d}/config.ru")
      assert_equal 1, status.exitstatus
      assert_equal 1, err.lines.size, err
      assert_match(%r{\Ablackbuck: cannot load .*config\.ru: RuntimeError: boom in an initializer \(config/initializers/boom\.rb:2\)$}, err)
    end
  end

  def test_debug_shows_the_whole_backtrace_as_one_entry
    with_failing_app do |d|
      [[["--debug"], {}], [[], { "BLACKBUCK_DEBUG" => "1" }]].each do |flags, env|
        _o, err, status = run_cli(*flags, "-l", "127.0.0.1:0", "#{d}/config.ru", env: env)
        assert_equal 1, status.exitstatus
        lines = err.lines
        assert_match(/\Ablackbuck: cannot load .*boom\.rb:2\)$/, lines.first)
        assert_operator lines.size, :>, 3, err
        assert(lines.drop(1).all? { |l| l.start_with?("    ") }, "further lines are indented (one entry): #{err}")
        assert_match(%r{config/initializers/boom\.rb:2:in}, err)
        assert_match(/config\.ru:1:in/, err)
      end
    end
  end

  def test_multi_line_message_stays_one_line
    with_failing_app("first line\nsecond line") do |d|
      _o, err, = run_cli("-l", "127.0.0.1:0", "#{d}/config.ru")
      assert_equal 1, err.lines.size, err
      assert_match(%r{RuntimeError: first line / second line \(config/initializers/boom\.rb:2\)$}, err)
    end
  end

  def test_rails_env_is_the_fallback_for_the_environment
    s = start_server(["-l", "127.0.0.1:0"], env: { "RACK_ENV" => nil, "RAILS_ENV" => "production" })
    assert_match(/Blackbuck \S+ \(production\)/, s.log)
    s = start_server(["-l", "127.0.0.1:0"], env: { "RACK_ENV" => "staging", "RAILS_ENV" => "production" })
    assert_match(/Blackbuck \S+ \(staging\)/, s.log, "RACK_ENV comes first")
    s = start_server(["-l", "127.0.0.1:0", "-E", "test"], env: { "RACK_ENV" => "staging", "RAILS_ENV" => "production" })
    assert_match(/Blackbuck \S+ \(test\)/, s.log, "-E wins")
  end

  def test_config_blackbuck_rb_is_read_when_present
    dir = Dir.mktmpdir("bb-test")
    FileUtils.mkdir_p("#{dir}/config")
    File.write("#{dir}/config/blackbuck.rb", "listen \"unix:#{dir}/from-default.sock\"\nkeepalive_timeout 7\n")
    s = start_server([], dir: dir, chdir: dir, app: "kitchen.ru")
    assert_includes s.addrs, "unix:#{dir}/from-default.sock"
    assert_match(%r{config config/blackbuck\.rb}, s.log)
    io = s.unix
    assert_equal 200, request(io, "GET", "/hello").status
  ensure
    io&.close
  end
end
