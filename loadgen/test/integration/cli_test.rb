# frozen_string_literal: true

require_relative "helper"

# Mistakes on the command line: one line on stderr, exit 1, nothing on stdout.
class CliTest < Minitest::Test
  include LoadgenHelper

  def assert_usage_error(*args, match:)
    r = run_load(*args, limit: 5)
    assert_equal 1, r.status.exitstatus, r.to_s
    assert_equal "", r.out, r.to_s
    assert_equal 1, r.err.lines.size, r.to_s
    assert_match match, r.err
  end

  def test_unknown_long_option = assert_usage_error("--frobnicate", "http://127.0.0.1:1/", match: /unknown option: --frobnicate/)
  def test_unknown_short_option = assert_usage_error("-z", "http://127.0.0.1:1/", match: /unknown option: -z/)
  def test_missing_url = assert_usage_error("-d", "1s", match: /missing URL/)
  def test_missing_value = assert_usage_error("http://127.0.0.1:1/", "-d", match: /requires a value/)
  def test_bad_duration = assert_usage_error("-d", "ten", "http://127.0.0.1:1/", match: /invalid duration: 'ten'/)
  def test_bad_duration_unit = assert_usage_error("-d", "10x", "http://127.0.0.1:1/", match: /invalid duration/)
  def test_zero_threads = assert_usage_error("-t", "0", "http://127.0.0.1:1/", match: /thread count/)
  def test_bad_timeout = assert_usage_error("--timeout", "0", "http://127.0.0.1:1/", match: /invalid timeout/)
  def test_connections_below_threads = assert_usage_error("-t", "4", "-c", "2", "http://127.0.0.1:1/", match: /connections must be >= threads/)
  def test_https = assert_usage_error("https://127.0.0.1/", match: /https is not supported/)
  def test_bad_url = assert_usage_error("127.0.0.1:8080", match: /invalid URL/)
  def test_bad_port = assert_usage_error("http://127.0.0.1:99999/", match: /bad port/)
  def test_rate_with_pipeline = assert_usage_error("-R", "10", "--pipeline", "2", "http://127.0.0.1:1/", match: /cannot be combined/)
  def test_bad_header = assert_usage_error("-H", "nocolon", "http://127.0.0.1:1/", match: /invalid header/)
  def test_missing_body_file = assert_usage_error("--body-file", "/nonexistent/x", "http://127.0.0.1:1/", match: /body file/)
  def test_lua_script_is_refused = assert_usage_error("-s", "x.lua", "http://127.0.0.1:1/", match: /Lua scripts/)

  def test_socket_path_does_not_exist
    assert_usage_error("-P", "/nonexistent/dir/app.sock", "http://localhost/", match: %r{/nonexistent/dir/app.sock: No such file})
  end

  def test_socket_path_not_a_socket
    assert_usage_error("--unix-socket", __FILE__, "http://localhost/", match: /not a UNIX socket/)
  end

  def test_socket_path_too_long
    assert_usage_error("-P", "/tmp/" + "x" * 200, "http://localhost/", match: /path too long: 205 bytes \(max 107\)/)
  end

  def test_connection_refused
    assert_usage_error("-d", "1s", "http://127.0.0.1:#{free_port}/", match: /unable to connect to 127.0.0.1:\d+: Connection refused/)
  end

  def test_help_and_version
    r = run_load("--help", limit: 5)
    assert r.success?
    assert_match(/--unix-socket/, r.out)
    r = run_load("-v", limit: 5)
    assert r.success?
    assert_match(/blackbuck-load \d+\.\d+\.\d+/, r.out)
  end
end
