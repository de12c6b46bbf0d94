# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# What the server says when something is wrong, and the words of its answers (issue 22, item 10):
# each message names what is wrong and where it was set, in one line.
class MessagesTest < ServerTest
  def run_cli(*args, chdir: ROOT)
    Open3.capture3(RbConfig.ruby, EXE, *args, chdir: chdir)
  end

  def test_a_misspelt_option_gets_the_nearest_one
    { "--wokers" => "--workers", "--wokers=3" => "--workers", "--no-keepalve" => "--no-keepalive",
      "--stats-lisen" => "--stats-listen" }.each do |given, meant|
      _out, err, status = run_cli(given, "3", File.join(APPS, "hello.ru"))
      assert_equal 2, status.exitstatus, given
      assert_equal "blackbuck: invalid option: #{given} (did you mean #{meant}?) (see blackbuck --help)\n", err
    end
    _out, err, status = run_cli("--zzzzzz")
    assert_equal [2, "blackbuck: invalid option: --zzzzzz (see blackbuck --help)\n"], [status.exitstatus, err]
    _out, err, status = run_cli("status", "--jsn")
    assert_equal [2, "blackbuck status: invalid option: --jsn (did you mean --json?) (see blackbuck status --help)\n"],
                 [status.exitstatus, err]
  end

  def test_config_file_errors_carry_the_line_that_raised
    Dir.mktmpdir("bb-test") do |dir|
      Dir.mkdir("#{dir}/config")
      {
        "workers 2\n\nworkers \"x\"\n" => %(config/blackbuck.rb:3: workers must be an integer 1..4096, got "x"),
        "workers 2\nworkrs 2\n" => "config/blackbuck.rb:2: unknown directive workrs (did you mean workers?)",
        "workers 2\n\n\nafter_fork\n" => "config/blackbuck.rb:4: after_fork must be a block or a Proc",
        "timeout 5\nraise 'boom'\n" => "config/blackbuck.rb:2: RuntimeError: boom",
        # Ruby 3.1's parser: "unexpected end-of-input"; Prism (3.4, 4.0): its first problem, one line
        "timeout 5\nif\n" => /\Aconfig\/blackbuck\.rb:2: syntax error, (unexpected end-of-input|expected .+)\z/
      }.each do |source, message|
        File.write("#{dir}/config/blackbuck.rb", source)
        _out, err, status = run_cli("--check", File.join(APPS, "hello.ru"), chdir: dir)
        if message.is_a?(Regexp)
          assert_equal 1, status.exitstatus, source
          assert_match message, err.delete_prefix("blackbuck: ").chomp, source
          assert_equal 1, err.lines.size, source
        else
          assert_equal [1, "blackbuck: #{message}\n"], [status.exitstatus, err], source
        end
      end
    end
  end

  # The status listener's address is taken: the error says it is the status listener's, and where
  # its address was set.
  def test_a_status_listener_that_cannot_bind_says_so_and_where_it_was_set
    taken = TCPServer.new("127.0.0.1", 0)
    port = taken.addr[1]
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/bb.rb", %(listen "127.0.0.1:0"\nstats_listen "127.0.0.1:#{port}"\n))
    _out, err, status = run_cli("-w", "1", "-c", "#{dir}/bb.rb", File.join(APPS, "hello.ru"))
    assert_equal 1, status.exitstatus, err
    assert_match(/^blackbuck: status listener \(stats_listen in #{Regexp.escape(dir)}\/bb\.rb\): cannot listen on 127\.0\.0\.1:#{port}: Address already in use/,
                 err)
    _out, err, status = run_cli("-w", "1", "-l", "127.0.0.1:0", "--stats-listen", "127.0.0.1:#{port}", File.join(APPS, "hello.ru"))
    assert_equal 1, status.exitstatus, err
    assert_match(/^blackbuck: status listener \(--stats-listen\): cannot listen on 127\.0\.0\.1:#{port}: Address already in use/, err)
  ensure
    taken&.close
    FileUtils.rm_rf(dir) if dir
  end

  STATUS_APP = <<~RU
    run lambda { |env|
      code = Integer(env["PATH_INFO"].delete_prefix("/"))
      [code, {}, code == 304 ? [] : ["x"]]
    }
  RU

  # Every code of IANA's registry goes out with its phrase, whether Rack's table has it or not
  # (Rack 3 has no 418, 306 or 510); one that is not registered, with an empty phrase.
  def test_registered_codes_get_their_reason_phrase
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/codes.ru", STATUS_APP)
    server = start_server(["-l", "127.0.0.1:0"], app: "#{dir}/codes.ru", dir: dir)
    io = server.tcp
    { 418 => "I'm a teapot", 510 => "Not Extended", 425 => "Too Early", 200 => "OK", 299 => "" }.each do |code, phrase|
      res = request(io, "GET", "/#{code}")
      assert_equal "HTTP/1.1 #{code} #{phrase}", res.raw.lines.first.chomp, code
    end
  ensure
    io&.close
  end

  BAD_HEADER_APP = <<~'RU'
    run lambda { |env|
      case env["PATH_INFO"]
      when "/crlf" then [200, { "x-evil" => "a\r\nInjected: yes" }, ["x"]]
      when "/nul" then [200, { "x-list" => ["fine", "b\0c"] }, ["x"]]
      when "/name" then [200, { "x evil\r\n" => "v" }, ["x"]]
      when "/esc" then [200, { "x-color" => "\e[31mred" }, ["x"]]
      when "/soh" then [200, { "x-list" => ["fine", "a\x01b"] }, ["x"]]
      when "/del" then [200, { "x-del" => "a\x7fb" }, ["x"]]
      when "/tab" then [200, { "x-tab" => "a\tb", "x-obs" => "caf\xC3\xA9".b }, ["x"]]
      else [200, {}, ["fine"]]
      end
    }
  RU

  # An app's header with a control byte other than HTAB in its value (CR, LF, NUL, ESC, 0x01, DEL;
  # RFC 9110 5.5): 500, and the log names the header and shows its value escaped, on one line (the
  # raw bytes would end the log line where the app put a newline). HTAB and obs-text pass.
  def test_a_bad_header_value_is_logged_with_its_name_and_the_value_escaped
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/bad.ru", BAD_HEADER_APP)
    server = start_server(["-l", "127.0.0.1:0"], app: "#{dir}/bad.ru", dir: dir)
    {
      "/crlf" => 'invalid value of response header "x-evil": "a\r\nInjected: yes" (control bytes other than HTAB are not allowed)',
      "/nul" => 'invalid value of response header "x-list": "b\u0000c" (control bytes other than HTAB are not allowed)',
      "/name" => 'invalid response header name "x evil\r\n"',
      "/esc" => 'invalid value of response header "x-color": "\e[31mred" (control bytes other than HTAB are not allowed)',
      "/soh" => 'invalid value of response header "x-list": "a\u0001b" (control bytes other than HTAB are not allowed)',
      "/del" => 'invalid value of response header "x-del": "a\u007Fb" (control bytes other than HTAB are not allowed)'
    }.each do |path, message|
      io = server.tcp
      assert_equal 500, request(io, "GET", path).status, path
      io.close
      assert_logged(server, /ERROR invalid response: GET #{path}: ArgumentError: #{Regexp.escape(message)}/)
    end
    refute_match(/^Injected/, server.log)
    io = server.tcp
    res = request(io, "GET", "/tab")
    assert_equal [200, "a\tb"], [res.status, res.headers["x-tab"]], "HTAB stays allowed in a value"
    io.close
  end

  # `blackbuck status` shows sub-millisecond percentiles to the microsecond.
  def test_status_shows_fast_requests_to_the_microsecond
    server = start_both(stats: true)
    io = server.tcp
    20.times { assert_equal 200, request(io, "GET", "/").status }
    io.close
    recent = wait_for(15, "20 requests counted") do
      r = status_json(stats_path(server))["recent"]
      r if r && r["requests"] == 20
    end
    out, err, status = run_cli("status", "unix:#{stats_path(server)}")
    assert status.success?, err
    p50 = recent["duration"]["p50"]
    shown = out[/app p50 (\S+)/, 1]
    assert_equal format(p50 < 0.001 ? "%.3fms" : "%.1fms", p50 * 1000), shown, out
  end
end
