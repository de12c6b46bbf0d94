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

  URL = "http://127.0.0.1:1/"

  def test_target_without_weight = assert_usage_error("--target", "GET /a", match: /--target needs two values: 'METHOD PATH' and a weight/)
  def test_target_weight_zero = assert_usage_error("--target", "GET /a", "0", URL, match: /invalid weight '0' for target 'GET \/a' \(expected an integer from 1 to 1000000\)/)
  def test_target_weight_too_big = assert_usage_error("--target", "GET /a", "1000001", URL, match: /invalid weight '1000001'/)
  def test_target_weight_forgotten = assert_usage_error("--target", "GET /a", URL, match: %r{invalid weight 'http://127.0.0.1:1/' for target 'GET /a'})
  def test_target_without_path = assert_usage_error("--target", "GET", "1", URL, match: /invalid target 'GET' \(expected 'METHOD PATH'/)
  def test_target_bad_path = assert_usage_error("--target", "GET a", "1", URL, match: /invalid path 'a' in target 'GET a'/)
  def test_target_bad_method = assert_usage_error("--target", "G(T /a", "1", URL, match: /invalid method 'G\(T'/)
  def test_target_twice = assert_usage_error("--target", "GET /a", "1", "--target", "GET /a", "2", URL, match: /target 'GET \/a' is given twice/)
  def test_targets_file_missing = assert_usage_error("--targets", "/nonexistent/mix.txt", URL, match: %r{cannot read targets file /nonexistent/mix.txt: No such file})
  def test_per_connection_without_targets = assert_usage_error("--target-per-connection", URL, match: /--target-per-connection needs --target or --targets/)
  def test_method_with_targets = assert_usage_error("-m", "POST", "--target", "GET /a", "1", URL, match: /-m\/--method cannot be combined with --target/)
  def test_bad_seed = assert_usage_error("--seed", "x1", URL, match: /invalid seed: 'x1'/)

  def test_per_connection_target_left_without_a_connection
    assert_usage_error("-t", "1", "-c", "4", "--target-per-connection", "--target", "GET /fast", "16", "--target", "GET /slow", "2", URL,
                       match: %r{target 'GET /slow' \(weight 2 of 18\) gets 0 of 4 connections})
  end

  def test_targets_file_errors_name_file_and_line
    Dir.mktmpdir("bl-targets") do |dir|
      file = File.join(dir, "mix.txt")
      File.write(file, "# mix\nGET /a 1\nGET /b\n")
      assert_usage_error("--targets", file, URL, match: /\A[^\n]*#{Regexp.escape(file)}:3: expected METHOD PATH WEIGHT, got 'GET \/b'$/)
      File.write(file, "GET /a 1\nGET /b x\n")
      assert_usage_error("--targets", file, URL, match: /#{Regexp.escape(file)}:2: invalid weight 'x' for target 'GET \/b'/)
      File.write(file, "# only comments\n\n")
      assert_usage_error("--targets", file, URL, match: /#{Regexp.escape(file)}: no targets/)
      File.write(file, (0..64).map { |i| "GET /#{i} 1\n" }.join)
      assert_usage_error("--targets", file, URL, match: /#{Regexp.escape(file)}:65: too many targets: 'GET \/64' would be number 65 \(at most 64\)/)
    end
  end

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

  # Issue 32, item 11: a socket file whose server has gone, or an abstract name nobody holds, refuses
  # the connection tried before the run: one line, exit 1, no run (was a whole run of connect errors,
  # exit 0).
  def test_unix_socket_nobody_listens_on
    Dir.mktmpdir("bl-cli") do |dir|
      path = File.join(dir, "gone.sock")
      UNIXServer.new(path).close # the file stays; nobody listens
      assert File.socket?(path)
      assert_usage_error("-d", "30s", "-P", path, "http://localhost/",
                         match: /\Ablackbuck-load: unable to connect to UNIX socket #{Regexp.escape(path)}: Connection refused \(is the server listening\?\)$/)
    end
  end

  def test_abstract_socket_nobody_holds
    skip "abstract sockets are Linux-only" unless RUBY_PLATFORM.include?("linux")
    assert_usage_error("-d", "30s", "-P", "@bl-nobody-#{Process.pid}", "http://localhost/",
                       match: /unable to connect to UNIX socket @bl-nobody-\d+: Connection refused/)
  end

  # A space or a control byte in the URL would be sent as is: a space splits the request line, a line
  # break ends it. Refused before anything connects (the port here has no server: no connect is tried).
  def test_url_with_a_space_or_control_byte
    assert_usage_error("http://127.0.0.1:1/a b", match: %r{\Ablackbuck-load: invalid URL: a space, 0x20 after 'http://127\.0\.0\.1:1/a' \(percent-encode it, e\.g\. %20 for a space\)$})
    assert_usage_error("http://127.0.0.1:1/a\r\nX-Injected: 1", match: %r{invalid URL: a control byte, 0x0d after 'http://127\.0\.0\.1:1/a'})
    assert_usage_error("http://127.0.0.1:1/?q=\t", match: /invalid URL: a control byte, 0x09 after/)
    assert_usage_error("http://127.0.0.1:1/\x7f", match: /invalid URL: a control byte, 0x7f after/)
    assert_usage_error("http://127.0.0.1:1/caf\u00e9", match: /invalid URL: a byte past ASCII, 0xc3 after/)
    Dir.mktmpdir("bl-cli") do |dir| # with -P the URL gives the path only: checked all the same
      path = File.join(dir, "app.sock")
      server = UNIXServer.new(path)
      assert_usage_error("-P", path, "http://localhost/a b", match: /invalid URL: a space, 0x20 after 'http:\/\/localhost\/a'/)
    ensure
      server&.close
    end
  end

  def test_help_and_version
    r = run_load("--help", limit: 5)
    assert r.success?
    assert_match(/--unix-socket/, r.out)
    assert_match(/Exit status: 0 when the run got at least one 2xx or 3xx response; 1 when none did/, r.out)
    r = run_load("-v", limit: 5)
    assert r.success?
    assert_match(/blackbuck-load \d+\.\d+\.\d+/, r.out)
  end
end
