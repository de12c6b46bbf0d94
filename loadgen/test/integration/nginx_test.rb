# frozen_string_literal: true

require_relative "helper"

# blackbuck-load against Debian's nginx, started here with a private prefix:
# request counts must reconcile with nginx's access log.
class NginxTest < Minitest::Test
  include LoadgenHelper

  NGINX = "/usr/sbin/nginx"

  def setup
    skip "#{NGINX} not installed (apt-get install nginx)" unless File.executable?(NGINX)
    @dir = Dir.mktmpdir("bl-nginx")
    @port = free_port
    @sock = File.join(@dir, "nginx.sock")
    @log = File.join(@dir, "access.log")
    File.write(File.join(@dir, "nginx.conf"), <<~CONF)
      daemon off;
      master_process off;
      worker_processes 1;
      pid #{@dir}/nginx.pid;
      error_log #{@dir}/error.log;
      events { worker_connections 1024; }
      http {
        client_body_temp_path #{@dir}/body;
        proxy_temp_path #{@dir}/proxy;
        fastcgi_temp_path #{@dir}/fastcgi;
        uwsgi_temp_path #{@dir}/uwsgi;
        scgi_temp_path #{@dir}/scgi;
        log_format counted '$request_method $status';
        access_log #{@log} counted;
        keepalive_requests 1000000;
        server {
          listen 127.0.0.1:#{@port};
          listen unix:#{@sock};
          location / { return 200 "hello from nginx\\n"; }
        }
      }
    CONF
    @pid = Process.spawn(NGINX, "-p", @dir, "-c", File.join(@dir, "nginx.conf"), out: File::NULL, err: File.join(@dir, "stderr"))
    wait_ready
  end

  def teardown
    if @pid
      Process.kill(:TERM, @pid)
      Timeout.timeout(5) { Process.wait(@pid) }
    end
  rescue Timeout::Error
    Process.kill(:KILL, @pid)
    Process.wait(@pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  ensure
    FileUtils.rm_rf(@dir) if @dir
  end

  def wait_ready
    deadline = Time.now + 5
    loop do
      begin
        TCPSocket.new("127.0.0.1", @port).close
        return if File.socket?(@sock)
      rescue SystemCallError
        nil
      end
      flunk "nginx did not start: #{File.read(File.join(@dir, 'stderr')) rescue ''}" if Time.now > deadline
      sleep 0.05
    end
  end

  # Lines nginx logged since the last call (nginx appends, so truncating is safe).
  def logged
    sleep 0.3 # let nginx finish the requests in flight at the stop
    lines = File.readlines(@log)
    File.truncate(@log, 0)
    lines
  end

  def url = "http://127.0.0.1:#{@port}/"

  def assert_counts(result, json, in_flight)
    lines = logged
    server = lines.size
    client = json["requests"]
    assert_operator client, :>, 100, result.out
    assert_operator server - client, :>=, 0, "nginx logged #{server}, we counted #{client}\n#{result.out}"
    assert_operator server - client, :<=, in_flight, "nginx logged #{server}, we counted #{client}\n#{result.out}"
    assert_equal [0, 0, 0, 0], socket_errors_of(result.out), result.out
    lines
  end

  def test_keepalive_tcp
    File.truncate(@log, 0)
    r, j = run_json("-t", "2", "-c", "10", "-d", "1s", url)
    assert_counts(r, j, 10)
    assert_equal 0, j["bytes"] % j["requests"], "every nginx response has the same size: bytes must be exact"
  end

  def test_keepalive_unix
    File.truncate(@log, 0)
    r, j = run_json("-t", "1", "-c", "10", "-d", "1s", "-P", @sock, "http://localhost/")
    assert_counts(r, j, 10)
    assert_equal 0, j["bytes"] % j["requests"]
  end

  def test_no_keepalive_unix_and_tcp
    File.truncate(@log, 0)
    r, j = run_json("-t", "1", "-c", "4", "-d", "1s", "--no-keepalive", "-P", @sock, "http://localhost/")
    assert_counts(r, j, 4)
    r, j = run_json("-t", "1", "-c", "4", "-d", "1s", "--no-keepalive", url)
    assert_counts(r, j, 4)
  end

  def test_pipeline
    File.truncate(@log, 0)
    r, j = run_json("-t", "1", "-c", "4", "-d", "1s", "--pipeline", "8", url)
    assert_counts(r, j, 4 * 8)
  end

  def test_head_requests
    File.truncate(@log, 0)
    r, j = run_json("-t", "1", "-c", "2", "-d", "1s", "-m", "HEAD", url)
    lines = assert_counts(r, j, 2)
    assert lines.all? { |l| l == "HEAD 200\n" }
  end

  def test_report_matches_wrk_line_for_line
    wrk = "/usr/bin/wrk"
    skip "wrk not installed" unless File.executable?(wrk)
    ours = run_load("-t", "1", "-c", "4", "-d", "1s", "--latency", url)
    out, = Open3.capture2(wrk, "-t", "1", "-c", "4", "-d", "1s", "--latency", url)
    assert_wrk_report(out)      # the shape check describes wrk...
    assert_wrk_report(ours.out) # ...and we pass it too
    # the same lines in the same order, once numbers (with their units) are masked
    strip = lambda do |text|
      text.lines.reject { |l| l =~ /\A  +99\.99?%/ }
          .map { |l| l.gsub(/\d+(?:\.\d+)?(?:us|ms|[smhkKMGT])?B?/, "N").squeeze(" ") }
    end
    assert_equal strip.(out), strip.(ours.out)
  end
end
