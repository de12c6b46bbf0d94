# frozen_string_literal: true

require "minitest/autorun"
require "stringio"
require "blackbuck/cli"

# `blackbuck --help` states defaults, and Config::DEFAULTS is where they are set: every
# "(default X)" the help prints must be the setting's value there (one source of truth), and the
# CLI's source must not write one by hand.
class CLIHelpTest < Minitest::Test
  Config = Blackbuck::Config

  # Options whose default is looked up when the server starts, not a value of DEFAULTS.
  DERIVED = {
    "port" => "$PORT or #{Config::DEFAULT_PORT}",
    "workers" => "$WEB_CONCURRENCY or the CPU count",
    "threads" => "$RAILS_MAX_THREADS, else #{Config::DEFAULTS.fetch(:threads)}",
    "pid" => "$PIDFILE",
    "timeout" => Config::REQUEST_TIMEOUT.to_s, # "; off in development" follows
    "config" => "#{Config::DEFAULT_FILE} when present",
    "env" => "$RACK_ENV, else $RAILS_ENV, else #{Config::DEFAULT_ENVIRONMENT}"
  }.freeze
  OPTION = /\A\s+(?:-\w, )?--(?:\[no-\])?([a-z][a-z-]*)/          # an option's line, its long name
  STATED = /\(default ([^;)]+?)(?: = [^;)]*)?(?:[;)]|: )/        # the default it states

  def help
    out = StringIO.new
    assert_raises(SystemExit) { Blackbuck::CLI.new(["--help"], out: out, err: StringIO.new).run }
    out.string
  end

  def expected(name)
    return DERIVED.fetch(name) if DERIVED.key?(name)

    case (value = Config::DEFAULTS.fetch(name.tr("-", "_").to_sym))
    when true then "on"
    when false then "off"
    else value.to_s
    end
  end

  def test_every_default_the_help_states_is_config_defaults
    checked = help.lines.filter_map do |line|
      next unless (name = line[OPTION, 1]) && (stated = line[STATED, 1])

      assert_equal expected(name), stated, "--#{name}: #{line.strip}"
      name
    end
    assert_operator checked.size, :>=, 30, "the help's defaults were found: #{checked.join(' ')}"
    assert_includes checked, "backlog"
    assert_includes checked, "keepalive" # a boolean: on/off
  end

  def test_the_banner_and_the_file_section_take_their_defaults_from_config
    text = help
    assert_includes text, "[RACKUP_FILE (default: #{Config::DEFAULTS.fetch(:rackup)})]"
    files_on = Config::DEFAULTS[:x_sendfile] || Config::DEFAULTS[:x_accel_mapping].any?
    assert_includes text, "Files named by the app (#{files_on ? 'on' : 'off'} by default;"
  end

  # A default written by hand could still equal Config's today: the CLI's source writes none of the
  # forms its help used to (a number, on/off, a path, "$PORT or 9292", "else development").
  def test_the_cli_writes_no_default_by_hand
    source = File.read(File.expand_path("../../lib/blackbuck/cli.rb", __dir__))
    hand_written = source.lines.grep(%r{\(default:? (?:[\d"]|on\b|off\b|config/|\$PORT or \d)|else development\)})
    assert_empty hand_written
  end
end
