# frozen_string_literal: true

require_relative "../test_helper"
require "net/http"
require "json"
require "digest"
require "open3"

# A real Rails app (test/apps/rails) run by the real `blackbuck`, by `rails server -u blackbuck` and
# by `RACKUP_HANDLER=blackbuck rails server`: `rake test:rails` runs this file once under each of
# gemfiles/rails7 and rails8 (Ruby >= 3.2) or rails61 (Debian's Rails 6.1) and rails7 (Ruby 3.1).
# Every check speaks to the app through a real client (Net::HTTP, raw sockets, nginx with upstream keep-alive).
class RailsAppTest < ServerTest
  APP = File.join(APPS, "rails")
  BIG = 4 * 1024 * 1024 # bytes of public/big.bin, served by send_file and by the static files
  UPLOAD = 5 * 1024 * 1024

  def setup
    begin
      require "rails/version"
    rescue LoadError
      skip "Rails is not in this bundle (rake test:rails runs this file under gemfiles/rails61 and rails7)"
    end
    @app_dir = Dir.mktmpdir("bb-test-rails")
    FileUtils.cp_r("#{APP}/.", @app_dir)
    @big = Random.new(7).bytes(BIG)
    File.binwrite("#{@app_dir}/public/big.bin", @big)
  end

  def teardown
    super
    FileUtils.rm_rf(@app_dir) if @app_dir
  end

  def rails_major_minor = Rails::VERSION::STRING.split(".").first(2).join(".")

  def test_blackbuck_command_serves_the_app
    server = start_server(["-E", "production", "-l", "127.0.0.1:0", "-l", "unix:#{@app_dir}/app.sock"],
                          app: "#{@app_dir}/config.ru", workers: 2, dir: @app_dir)
    check_app("127.0.0.1", server.tcp_port)
    sse_arrives_as_written(server.tcp_port)
    # and over the UNIX socket, what nginx uses
    sock = server.unix
    res = request(sock, "GET", "/json")
    assert_equal "world", JSON.parse(res.body)["hello"]
  ensure
    sock&.close
  end

  # The streams setting with Rails' default isolation_level (:thread; Rails 6.1 has no other): the
  # boot warns once, naming the fix, and ActionController::Live's SSE still arrives as written, its
  # body popping Live's queue on a stream's fiber.
  def test_streams_warns_of_per_thread_state_and_live_sse_streams
    server = start_server(["-E", "production", "--streams", "-l", "127.0.0.1:0"],
                          app: "#{@app_dir}/config.ru", workers: 1, dir: @app_dir)
    assert_logged(server, /WARN streams is on, but this Rails app keeps its per-request state per thread .*isolation_level = :fiber/)
    assert_equal 1, server.log.scan("streams is on, but").size, "one line, from the process that loaded the app"
    sse_arrives_as_written(server.tcp_port)
    check_app("127.0.0.1", server.tcp_port)
  end

  def test_rails_server_u_blackbuck
    rails = start_rails_server("-b", "127.0.0.1", "-p", "0")
    port = Integer(rails.log[%r{listening on http://127\.0\.0\.1:(\d+)}, 1])
    check_app("127.0.0.1", port)
    sse_arrives_as_written(port)
    assert_match(/=> Booting Blackbuck/, rails.log)
    Process.kill(:INT, -rails.pid) # Ctrl-C
    status = rails.wait_exit(20)
    assert status&.success?, "rails server exits 0 on Ctrl-C:\n#{rails.log}"
    assert_match(/INT: stopping gracefully/, rails.log)
    refute_match(/unknown setting|NoMethodError|undefined method/, rails.log)
  end

  # config/blackbuck.rb is read by `rails server -u blackbuck` (as Puma reads config/puma.rb);
  # its listen wins over Rails' default port, -p over it; options Rails passes for itself are
  # logged at DEBUG level and ignored.
  def test_rails_server_reads_config_blackbuck_rb
    File.write("#{@app_dir}/config/blackbuck.rb", "workers 3\nlisten \"unix:#{@app_dir}/from-config.sock\"\n")
    rails = start_rails_server(workers: 3, env: { "BLACKBUCK_DEBUG" => "1" })
    assert_match(%r{listening on unix:#{Regexp.escape(@app_dir)}/from-config\.sock}, rails.log)
    refute_match(/listening on http/, rails.log, "Rails' default port 3000 does not override the file")
    assert_match(%r{config config/blackbuck\.rb}, rails.log)
    assert_match(/DEBUG option user_supplied_options ignored/, rails.log)
    sock = UNIXSocket.new("#{@app_dir}/from-config.sock")
    assert_equal 200, request(sock, "GET", "/json").status
    sock.close
    rails.stop

    port = free_port
    rails = start_rails_server("-b", "127.0.0.1", "-p", port.to_s, workers: 3)
    assert_match(/listening on http:\/\/127\.0\.0\.1:#{port}/, rails.log, "-b/-p win over the file")
    refute_match(/listening on unix/, rails.log)
  end

  # Rails 8's generated Dockerfile runs `./bin/thrust ./bin/rails server`: with
  # RACKUP_HANDLER=blackbuck (RACK_HANDLER on Rack 2) that server is Blackbuck. PIDFILE, as Kamal
  # or a Procfile sets it, names the master (Rails writes it, and so does Blackbuck); Kamal's
  # SOLID_QUEUE_IN_PUMA runs bin/jobs (here a stand-in that logs its start and its TERM).
  def test_rackup_handler_blackbuck_rails_server_and_pidfile
    require "rack"
    var = Rack.release.to_i >= 3 ? "RACKUP_HANDLER" : "RACK_HANDLER"
    pidfile = "#{@app_dir}/tmp/pids/from-env.pid"
    jobs_log = "#{@app_dir}/jobs.log"
    FileUtils.mkdir_p("#{@app_dir}/bin")
    File.write("#{@app_dir}/bin/jobs", <<~RUBY)
      #!#{RbConfig.ruby}
      File.write(#{jobs_log.inspect}, "start \#{Process.pid}\n", mode: "a")
      stop = false
      trap(:TERM) { stop = true }
      sleep 0.02 until stop
      File.write(#{jobs_log.inspect}, "term \#{Process.pid}\n", mode: "a")
    RUBY
    File.chmod(0o755, "#{@app_dir}/bin/jobs")
    rails = ChildProcess.new([RbConfig.ruby, "bin/rails", "server", "-e", "production", "-b", "127.0.0.1", "-p", "0"],
                             log_path: "#{@app_dir}/rails-handler.log", chdir: @app_dir,
                             env: { var => "blackbuck", "WEB_CONCURRENCY" => "2", "PIDFILE" => pidfile,
                                    "RAILS_MAX_THREADS" => "2", "SOLID_QUEUE_IN_PUMA" => "true" })
    (@rails ||= []) << rails
    wait_for(60) do
      flunk("rails server exited:\n#{rails.log}") if rails.exited?
      rails.log.scan(/worker \d+ \(pid \d+\) ready/).size >= 2
    end
    assert_match(/=> Booting Blackbuck/, rails.log)
    assert_match(/2 workers \(\$WEB_CONCURRENCY\) x 2 app threads \(\$RAILS_MAX_THREADS\)/, rails.log)
    port = Integer(rails.log[%r{listening on http://127\.0\.0\.1:(\d+)}, 1])
    check_app("127.0.0.1", port)
    assert_equal rails.pid, Integer(File.read(pidfile)), "PIDFILE names the server's master"
    jobs = wait_for(30, "bin/jobs started") { File.exist?(jobs_log) && File.read(jobs_log)[/\Astart (\d+)/, 1] }
    Process.kill(:TERM, rails.pid)
    assert rails.wait_exit(30)&.success?, rails.log
    refute File.exist?(pidfile), "the pid file goes with the server"
    assert_equal "start #{jobs}\nterm #{jobs}\n", File.read(jobs_log), "bin/jobs was stopped with the server"
  end

  # `bin/rails restart` touches tmp/restart.txt; the blackbuck command, run in a Rails app (which
  # has a tmp/ directory), watches it and restarts with the new code as HUP does.
  def test_bin_rails_restart_restarts_the_blackbuck_command
    FileUtils.mkdir_p("#{@app_dir}/tmp")
    server = start_server(["-E", "production", "-l", "127.0.0.1:0"], app: "#{@app_dir}/config.ru", workers: 2,
                                                                     dir: @app_dir)
    old = server.worker_pids
    _out, err, status = Open3.capture3(RbConfig.ruby, "bin/rails", "restart", chdir: @app_dir)
    assert status.success?, err
    assert_logged(server, %r{tmp/restart\.txt changed: restarting as HUP does}, 30)
    wait_for(90, "the new workers serve") { (server.worker_pids - old).size >= 2 }
    wait_for(30, "old workers gone") { server.log.scan(/old worker \(pid \d+\) exited/).size == 2 }
    check_app("127.0.0.1", server.tcp_port)
  end

  def test_behind_nginx_with_upstream_keepalive
    skip "nginx is not installed" unless NginxProxy.available?
    server = start_server(["-E", "production", "-l", "unix:#{@app_dir}/app.sock"],
                          app: "#{@app_dir}/config.ru", workers: 2, dir: @app_dir)
    nginx = NginxProxy.new("unix:#{@app_dir}/app.sock", forwarded_proto: "https")
    check_app("127.0.0.1", nginx.port, scheme: "https")
    sse_arrives_as_written(nginx.port)
  ensure
    nginx&.stop
  end

  # Issue 32: Rails' ShowExceptions rescues the request timeout raised in an action, so Blackbuck saw
  # an ordinary 500 and kept a worker interrupted anywhere (mid-query). Rails answers it 503 now
  # (rescue_responses), the log has the backtrace into the action, and the worker is replaced.
  def test_a_request_timeout_in_an_action_is_503_logged_and_replaces_the_worker
    server = start_server(["-E", "production", "-l", "127.0.0.1:0", "-t", "1"], app: "#{@app_dir}/config.ru",
                                                                               workers: 1, dir: @app_dir)
    old = server.worker_pids
    assert_equal 1, old.size
    Net::HTTP.start("127.0.0.1", server.tcp_port, read_timeout: 30) do |http|
      res = http.get("/slow?t=30")
      assert_equal "503", res.code, res.body
    end
    assert_logged(server, %r{request timeout \(1s\), rescued by the app: GET /slow: Blackbuck::RequestTimeout})
    assert_logged(server, %r{app/controllers/pages_controller\.rb:\d+:in .*slow}, 10)
    wait_for(60, "a new worker replaces the one that timed out") { (server.worker_pids - old).any? }
    wait_for(30, "the old worker exited") { !alive?(old.first) }
    Net::HTTP.start("127.0.0.1", server.tcp_port) { |http| assert_equal "200", http.get("/json").code }
  end

  def test_boot_error_in_an_initializer_names_its_line
    out, err, status = Open3.capture3({ "BB_BOOM" => "1", "BLACKBUCK_DEBUG" => nil }, RbConfig.ruby, EXE, "-E", "production",
                                      "-l", "127.0.0.1:0", "#{@app_dir}/config.ru")
    assert_equal 1, status.exitstatus, out + err
    assert_equal 1, err.lines.size, err
    assert_match(%r{RuntimeError: boom from an initializer \(config/initializers/boom\.rb:5\)$}, err)
    _out, err, = Open3.capture3({ "BB_BOOM" => "1" }, RbConfig.ruby, EXE, "--debug", "-E", "production",
                                "-l", "127.0.0.1:0", "#{@app_dir}/config.ru")
    assert_match(%r{config/initializers/boom\.rb:5:in}, err)
    assert_match(/railties.*:in/, err, "the whole backtrace, through Rails")
  end

  private

  # `bin/rails server -u blackbuck` in the app's directory, bound to 127.0.0.1.
  def start_rails_server(*args, workers: 2, env: {})
    rails = ChildProcess.new([RbConfig.ruby, "bin/rails", "server", "-u", "blackbuck", "-e", "production", *args],
                             log_path: "#{@app_dir}/rails-#{args.join}.log", chdir: @app_dir,
                             env: { "WEB_CONCURRENCY" => workers.to_s }.merge(env))
    (@rails ||= []) << rails
    wait_for(60) do
      flunk("rails server exited:\n#{rails.log}") if rails.exited?
      rails.log.scan(/worker \d+ \(pid \d+\) ready/).size >= workers
    end
    rails
  end

  def stop_rails
    (@rails || []).each do |r|
      r.stop
      warn "\n--- rails server log (#{name}) ---\n#{r.log}--- end ---" unless passed?
    end
  end

  def before_teardown
    stop_rails
    super
  end

  # Everything a Rails user meets, on one keep-alive connection.
  def check_app(host, port, scheme: "http")
    Net::HTTP.start(host, port, open_timeout: 5, read_timeout: 10) do |http|
      res = http.get("/json")
      assert_equal "200", res.code
      json = JSON.parse(res.body)
      assert_equal ["world", rails_major_minor, scheme], [json["hello"], json["rails"][/\A\d+\.\d+/], json["scheme"]]

      # a redirect with a session and a cookie (Rails 6.1's redirect body used to hang)
      res = http.post("/login", "name=ann", "Content-Type" => "application/x-www-form-urlencoded")
      assert_equal "302", res.code
      assert_match(%r{\A#{scheme}://[^/]+/whoami\z}, res["location"])
      cookies = res.get_fields("set-cookie").map { |c| c.split(";").first }.join("; ")
      assert_equal "user=ann seen=yes", http.get("/whoami", "Cookie" => cookies).body

      res = http.get("/invalid")
      assert_equal ["422", "not like that"], [res.code, res.body], "render status: 4xx"

      upload(http)

      res = http.get("/download")
      assert_equal "200", res.code
      assert_equal BIG.to_s, res["content-length"], "send_file has a size"
      assert_nil res["transfer-encoding"]
      assert_equal Digest::SHA256.hexdigest(@big), Digest::SHA256.hexdigest(res.body)

      res = http.get("/big.bin", "Range" => "bytes=1000-1999") # public file server: Rack::Files
      assert_equal ["206", "bytes 1000-1999/#{BIG}", "1000"], [res.code, res["content-range"], res["content-length"]]
      assert_equal @big.byteslice(1000, 1000), res.body

      res = http.head("/json")
      assert_equal "200", res.code
      assert_nil res.body

      res = http.get("/cached")
      assert_equal ["200", "fresh content"], [res.code, res.body]
      res = http.get("/cached", "If-None-Match" => res["etag"])
      assert_equal "304", res.code
      assert_nil res.body

      assert_equal "404", http.get("/no/such/page").code
      assert_equal "500", http.get("/boom").code
      assert_equal "200", http.get("/json").code, "the connection is still in sync after all that"
    end
  end

  def upload(http)
    data = Random.new(11).bytes(UPLOAD)
    req = Net::HTTP::Post.new("/upload")
    req.set_form([["note", "several MB"], ["file", StringIO.new(data), { filename: "up.bin", content_type: "application/octet-stream" }]],
                 "multipart/form-data")
    res = http.request(req)
    assert_equal "200", res.code, res.body
    json = JSON.parse(res.body)
    assert_equal ["up.bin", UPLOAD, Digest::SHA256.hexdigest(data), "several MB"],
                 json.values_at("name", "size", "sha256", "note")
  end

  # ActionController::Live: each event reaches the client when written (0.4 s apart), not at the end.
  def sse_arrives_as_written(port)
    io = TCPSocket.new("127.0.0.1", port)
    io.write("GET /events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n")
    seen = []
    buf = +""
    Timeout.timeout(15) do
      while seen.size < 3
        buf << io.readpartial(4096)
        buf.scan(/data: event (\d)/).flatten.each { |n| seen << [n, Process.clock_gettime(Process::CLOCK_MONOTONIC)] unless seen.assoc(n) }
      end
    end
    assert_match(%r{\AHTTP/1\.1 200 .*text/event-stream}m, buf)
    assert_equal %w[0 1 2], seen.map(&:first)
    spread = seen.last[1] - seen.first[1]
    assert_operator spread, :>=, 0.5, "the events arrived together (#{spread.round(3)} s apart): buffered, not streamed"
  ensure
    io&.close
  end
end
