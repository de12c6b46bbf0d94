# frozen_string_literal: true

require_relative "../test_helper"
require "open3"
require "net/http"

# Issue 32, items 7, 9 and 13: forms a config file (or a config/puma.rb moved over) writes that the
# server takes as meant, addresses that --check (and so a HUP's boot check) refuses as the boot
# would, and a log file that cannot be opened: each a clear answer, one line, never a backtrace.
class ConfigFormsTest < ServerTest
  HELLO = File.join(APPS, "hello.ru")

  def run_cli(*args, chdir: ROOT)
    Open3.capture3(RbConfig.ruby, EXE, *args, chdir: chdir)
  end

  def check_with(source, *args)
    Dir.mktmpdir("bb-test") do |dir|
      File.write("#{dir}/bb.rb", source)
      return run_cli("--check", "-c", "#{dir}/bb.rb", *args, HELLO)
    end
  end

  # `listen 8080` works, so does `stats_listen 9393`; `environment :production`; Puma's `threads 5, 5`.
  def test_forms_of_other_directives_are_taken
    { "stats_listen 9393\n" => "stats_listen 9393 (an Integer, as listen 8080)",
      "environment :production\n" => "environment :production (a Symbol)",
      "threads 5, 5\n" => "threads 5, 5 (Puma's MIN, MAX, as Rails' config/puma.rb writes it)" }.each do |source, what|
      out, err, status = check_with(source, "-w", "2")
      assert_equal [0, ""], [status.exitstatus, err], what
      assert_match(/boots \(2 workers, /, out, what)
    end
  end

  # The values themselves reach the server: the boot line says the environment and the threads,
  # and the status listener answers on 127.0.0.1 at the Integer port.
  def test_the_values_are_used
    stats_port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/bb.rb", "stats_listen #{stats_port}\nenvironment :production\nthreads 3, 3\n")
    server = start_server(["-l", "127.0.0.1:0", "-c", "#{dir}/bb.rb"])
    assert_match(/Blackbuck \S+ \(production\), 1 worker x 3 app threads, /, server.log, "1 worker, not 1 workers")
    assert_equal "200", Net::HTTP.get_response(URI("http://127.0.0.1:#{stats_port}/status")).code
  end

  def test_threads_min_max_that_differ_are_refused_with_what_to_write
    _out, err, status = check_with("workers 2\nthreads 1, 5\n")
    assert_equal 1, status.exitstatus
    assert_match(/\Ablackbuck: \S+bb\.rb:2: threads takes one count .*got threads 1, 5: give threads 5\n\z/, err)
  end

  def test_check_says_one_worker
    out, _err, status = run_cli("--check", "-w", "1", HELLO)
    assert_equal 0, status.exitstatus
    assert_match(/boots \(1 worker, /, out)
  end

  # --check parses the addresses it reports: what a HUP runs before it re-execs, so a bad one must
  # fail there (the old code serves on) rather than in the new image.
  def test_check_refuses_invalid_addresses
    {
      %w[-l nonsense:port:x] => /\Ablackbuck: invalid listen address "nonsense:port:x" \(want HOST:PORT/,
      %w[-l 127.0.0.1:99999] => /\Ablackbuck: invalid port in listen address "127\.0\.0\.1:99999" \(0\.\.65535\)/,
      %w[--stats-listen x:y:z] => /\Ablackbuck: invalid stats_listen address "x:y:z"/,
      %w[--stats-listen 70000] => /\Ablackbuck: invalid port in stats_listen address "70000"/
    }.each do |args, pattern|
      out, err, status = run_cli("--check", *args, HELLO)
      assert_equal [1, ""], [status.exitstatus, out], args.join(" ")
      assert_match pattern, err, args.join(" ")
      assert_equal 1, err.lines.size, err
    end
    { %(listen "foo bar"\n) => /bb\.rb:1: invalid listen address "foo bar"/,
      %(listen 8080\nstats_listen "127.0.0.1:70000"\n) => /bb\.rb:2: invalid port in stats_listen address "127\.0\.0\.1:70000"/ }.each do |source, pattern|
      _out, err, status = check_with(source)
      assert_equal 1, status.exitstatus, source
      assert_match pattern, err, source
      assert_equal 1, err.lines.size, err
    end
  end

  # An IPv6 host without a listen (`-o ::1`, `rails server -b ::1`) is an address, not a parse error.
  def test_an_ipv6_host_is_bound
    out, err, status = run_cli("--check", "-w", "1", "-o", "::1", "-p", "0", HELLO)
    assert_equal [0, ""], [status.exitstatus, err]
    assert_match(/boots \(1 worker, \[::1\]:0\)/, out)
    skip "no IPv6 loopback here" unless Socket.ip_address_list.any? { |a| a.ipv6_loopback? }
    server = start_server(["-o", "::1", "-p", "0"])
    assert_equal ["http://[::1]:#{server.tcp_port}"], server.addrs
    io = server.tcp
    assert_equal 200, request(io, "GET", "/").status
  ensure
    io&.close
  end

  # --log FILE that cannot be opened: one line naming the setting and the file, exit 1, no listener left.
  def test_a_log_file_that_cannot_be_opened_is_one_line
    dir = Dir.mktmpdir("bb-test")
    { "#{dir}/missing/server.log" => "No such file or directory", dir => "Is a directory" }.each do |path, why|
      out, err, status = run_cli("--log", path, "-w", "1", "-l", "unix:#{dir}/bb.sock", HELLO)
      assert_equal [1, ""], [status.exitstatus, out], path
      assert_equal "blackbuck: log #{path}: cannot open: #{why}\n", err
      refute File.exist?("#{dir}/bb.sock"), "nothing bound"
    end
  end
end
