# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/redis_server"
require "etc"
require "net/http"
require "shellwords"
require_relative "chromium"
require_relative "doc_snippets"
require_relative "generated_app"
require_relative "app_server"
require_relative "proxies"

# A real app in a real browser: a Rails app generated at test time (GeneratedApp: Rails 7.2 on
# Ruby 3.1, Rails 8.1 on Ruby >= 3.2, whichever gemfile `rake test:browser` chose) served by
# Blackbuck and driven by headless Chromium (Chromium) directly over TCP, through nginx over the
# UNIX socket and through HAProxy, each set up with the examples of README.md and docs/DEPLOY.md
# as written (DocSnippets: only addresses, ports and paths substituted), in development with
# `rails server -u blackbuck`, across a HUP that changes the listeners and the socket's mode, and
# through two reforks with DEPLOY.md's Memory config behind nginx and behind HAProxy, and with a long
# stream (ActionController::Live's Server-Sent Events, Turbo Streams) open on a server of one worker
# and one thread with `streams` on while other pages load, directly and behind nginx. Rails 8 also
# as its generated Dockerfile runs it: Thruster in front of `bin/rails server`, RACKUP_HANDLER=blackbuck.
# `rake test:browser` runs it under gemfiles/browser.gemfile or browser8.gemfile (installed by bin/setup).
class BrowserTest < Minitest::Test
  CABLE_TIMEOUT = 30 # seconds: a bound for an Action Cable (re)connection that went wrong
  WORKERS = 2 # WEB_CONCURRENCY given to every server whose command does not say
  DOCS = DocSnippets.new(ROOT)
  RAILS_SECTION = /Rails \(and Sinatra\)/
  NGINX_SECTION = /nginx in front, over a UNIX socket/
  HAPROXY_SECTION = /HAProxy in front/
  STATUS_SECTION = /Status and metrics/
  REFORK_BOUND = 120 # seconds: a bound for two reforks driven by the browsing below that went wrong
  JOB_TIMEOUT = 30 # seconds: a bound for a job enqueued from the page that went wrong (Solid Queue polls every 1 s)
  # The adapter that runs a job the page enqueues in production: as generated, async in Rails 7.2
  # (in the web worker), Solid Queue in Rails 8 (bin/jobs, which Blackbuck's master runs as a child
  # when SOLID_QUEUE_IN_PUMA is set, as Kamal's config/deploy.yml sets it).
  PRODUCTION_JOBS = GeneratedApp.rails8? ? "solid_queue" : "async"
  # Action Cable's production adapter as generated: Redis in Rails 7.2 (a redis-server of each
  # test's own, REDIS_URL), Solid Cable in Rails 8. Both run listener threads in the worker that
  # forks a mold; the reforks below run with DEPLOY.md's config alone (Blackbuck resets Action Cable
  # in the mold).
  REDIS = !GeneratedApp.rails8?
  # The streams tests' server (docs/ARCHITECTURE.md, "Long streams"): one worker with one app thread,
  # so a stream that held it would hold every other request; the app with per-fiber state, as
  # docs/CONFIGURATION.md says an app that turns `streams` on sets it (GeneratedApp: ISOLATION_LEVEL).
  STREAMS_ENV = { "WEB_CONCURRENCY" => nil, "RAILS_MAX_THREADS" => nil, "ISOLATION_LEVEL" => "fiber" }.freeze
  STREAM_BOUND = 30 # seconds: a bound for a stream's events, or its end, that went wrong

  # The app is generated once per run (about 20 s), in a directory nginx's www-data may traverse.
  # A generation that failed fails every test with its error, without trying again.
  def self.app
    raise @app_error if @app_error

    @app ||= begin
      parent = Dir.mktmpdir("bb-browser")
      File.chmod(0o711, parent) # as /run is: nginx's workers pass through to the socket's directory
      Minitest.after_run { FileUtils.rm_rf(parent) }
      GeneratedApp.new(parent).generate
    end
  rescue StandardError => e
    raise @app_error = e
  end

  def setup
    require_prerequisites
    @app = self.class.app
    @run = Dir.mktmpdir("run", File.dirname(@app.dir)) # stands for /run
    File.chmod(0o711, @run)
    @stoppable = []
    @redis = RedisServer.new if REDIS
    @browser = Chromium.new(Dir.mktmpdir("downloads", @run))
    @stoppable << @browser
  end

  def teardown
    @stoppable&.reverse_each do |s|
      log = s.log if !passed? && s.respond_to?(:log) # before the stop: nginx's and HAProxy's go with their directory
      s.is_a?(Chromium) ? s.quit : s.stop
      log = [log, s.log].max_by(&:size) if log # the server's goes on to its exit
      warn "\n--- #{s.class} log (#{name}) ---\n#{log}--- end ---" if log
    end
    @redis&.stop
    FileUtils.rm_f(@app.path("config/blackbuck.rb")) if @app
    FileUtils.rm_rf(@run) if @run
  end

  def test_directly_over_tcp
    write_readme_config
    port = free_port
    cmd = DOCS.command("README.md", section: RAILS_SECTION, pattern: /RAILS_ENV=production bin\/rails server -u blackbuck -b/)
              .sub("-b 0.0.0.0", "-b 127.0.0.1").sub(/-p \d+/, "-p #{port}")
    start_app(cmd)
    check_in_browser("http://127.0.0.1:#{port}")
  end

  def test_through_nginx_over_the_unix_socket_as_deploy_md_says
    sh = DOCS.block("docs/DEPLOY.md", section: NGINX_SECTION, lang: "sh", containing: "blackbuck ").sub("/run/blackbuck", "#{@run}/blackbuck")
    *setup_lines, command = sh.text.lines.map { |l| l.sub(/\s+#.*/, "").strip }.reject(&:empty?)
    setup_lines.each { |l| assert system(l), "#{l} failed" }
    start_app(Snippet.new(command, "DEPLOY.md's command"))
    sock = "#{@run}/blackbuck/app.sock"
    st = File.stat(sock)
    assert_equal [0o660, Etc.getgrnam(NginxSite::USER).gid], [st.mode & 0o777, st.gid], "the socket nginx's workers may use"
    nginx = start_deploy_nginx(sock)
    assert_upstream_keepalive(nginx, sock)
    check_in_browser("http://127.0.0.1:#{nginx.port}")
    refute_match(/\[(error|crit|alert|emerg)\]/, nginx.error_log)
  end

  def test_through_haproxy_as_deploy_md_says
    port = free_port
    config = DOCS.block("docs/DEPLOY.md", section: HAPROXY_SECTION, lang: "ruby").sub("10.0.0.5:8080", "127.0.0.1:#{port}")
    File.write(@app.path("config/blackbuck.rb"), config.text)
    start_app(production_command)
    front = free_port
    cfg = DOCS.block("docs/DEPLOY.md", section: HAPROXY_SECTION, lang: "haproxy")
              .sub(/^(\s*bind ):80$/, "\\1127.0.0.1:#{front}")
              .sub(/10\.0\.0\.[56]:8080/, "127.0.0.1:#{port}") # both "hosts" are this one Blackbuck
    haproxy = HAProxyProcess.new(cfg.text, port: front)
    @stoppable << haproxy
    check_in_browser("http://127.0.0.1:#{front}")
  end

  def test_rails_server_u_blackbuck_in_development
    write_readme_config
    port = free_port
    # README: `bin/rails server -u blackbuck` serves localhost:3000 in development; -p: a free port.
    # No WEB_CONCURRENCY, as on a developer's machine: one worker (as Puma), no request timeout
    # (issue 32, items 4 and 8: development's async Action Cable broadcasts within one process).
    cmd = DOCS.command("README.md", section: RAILS_SECTION, pattern: /\Abin\/rails server -u blackbuck\s*(#|\z)/)
    server = start_app(cmd, args: ["-p", port.to_s], env: { "RAILS_ENV" => "development", "WEB_CONCURRENCY" => nil })
    assert_includes server.listening, "http://127.0.0.1:#{port}"
    assert_match(/\(development\), 1 worker \(the default in development\), /, server.log)
    assert_match(/request timeout: off/, server.log)
    # localhost, not 127.0.0.1: development's Action Cable accepts only Origins on localhost.
    # Jobs: development's adapter is Active Job's default, async (neither app's development.rb sets one).
    check_in_browser("http://localhost:#{port}", jobs: "async")
  end

  if GeneratedApp.rails8?
    # The generated Dockerfile's ENTRYPOINT and CMD (bin/docker-entrypoint runs db:prepare, then
    # `./bin/thrust ./bin/rails server`) in the image's environment (its ENV lines but the image's
    # paths) and Kamal's (config/deploy.yml's env: SOLID_QUEUE_IN_PUMA and RAILS_MASTER_KEY), with
    # RACKUP_HANDLER=blackbuck the only change, and the ports: Thruster's HTTP_PORT (80 in the
    # image) and TARGET_PORT (3000), which it gives `rails server` as PORT, are free ports here.
    # Both bind every address, as in a container; the browser talks to 127.0.0.1 only.
    # WEB_CONCURRENCY: deploy.yml's commented-out `WEB_CONCURRENCY: 2`.
    def test_as_the_generated_dockerfile_runs_it_thruster_and_rails_server
      dockerfile = File.read(@app.path("Dockerfile"))
      entrypoint = JSON.parse(dockerfile[/^ENTRYPOINT (\[.*\])$/, 1])
      cmd = JSON.parse(dockerfile[/^CMD (\[.*\])$/, 1])
      assert_equal [["/rails/bin/docker-entrypoint"], ["./bin/thrust", "./bin/rails", "server"]], [entrypoint, cmd]
      image_env = dockerfile[/^ENV (.*?[^\\])$/m, 1].scan(/(\w+)="([^"]*)"/).to_h
      image_env = image_env.except("BUNDLE_PATH", "BUNDLE_DEPLOYMENT", "LD_PRELOAD") # the image's paths (gems, jemalloc)
      assert_equal({ "RAILS_ENV" => "production", "BUNDLE_WITHOUT" => "development" }, image_env)
      assert_equal({ "SOLID_QUEUE_IN_PUMA" => "true" }, @app.kamal_clear_env)

      http_port = free_port
      target_port = free_port
      env = { **image_env, **@app.production_env, "RACKUP_HANDLER" => "blackbuck", "WEB_CONCURRENCY" => WORKERS.to_s,
              "HTTP_PORT" => http_port.to_s, "TARGET_PORT" => target_port.to_s }
      server = AppServer.new(@app, [@app.path("bin/docker-entrypoint"), *cmd], env: env, workers: WORKERS, name: "server-#{name}")
      @stoppable << server
      assert_includes server.listening, "http://0.0.0.0:#{target_port}", "rails server ran Blackbuck on Thruster's TARGET_PORT"
      ProxyPort.wait(http_port, server.process, "thruster")
      check_in_browser("http://127.0.0.1:#{http_port}")
    end
  end

  # A long stream (issue 35): the app's ActionController::Live Server-Sent Events, Turbo Streams
  # that a <turbo-stream-source> appends to the page, on one worker with one thread and `streams`
  # on, while another browser loads a plain page of the app (check_stream). README's command.
  def test_a_long_stream_while_other_pages_load_directly_over_tcp
    port = free_port
    stats = free_port
    write_streams_config(stats)
    cmd = DOCS.command("README.md", section: RAILS_SECTION, pattern: /RAILS_ENV=production bin\/rails server -u blackbuck -b/)
              .sub("-b 0.0.0.0", "-b 127.0.0.1").sub(/-p \d+/, "-p #{port}")
    server = start_app(cmd, env: STREAMS_ENV)
    check_stream(server, "http://127.0.0.1:#{port}", stats)
  end

  # The same behind DEPLOY.md's nginx site as written, the stream's response marked as DEPLOY.md
  # says (X-Accel-Buffering: no, the line in the app's controller); DEPLOY.md's command with one
  # worker instead of four.
  def test_a_long_stream_while_other_pages_load_through_nginx_as_deploy_md_says
    # (nginx passes a stream on whatever the Rails version: the 3.4 lane's Rails 8 run is the check,
    # and the 3.1 lane keeps its minutes; the direct test runs on both)
    skip "run on the Rails 8 lane (Ruby >= 3.2)" unless GeneratedApp.rails8?
    unbuffered = DOCS.block("docs/DEPLOY.md", section: NGINX_SECTION, lang: "ruby", containing: "X-Accel-Buffering")
                     .text.lines.find { |l| l.include?("X-Accel-Buffering") }.strip
    assert_includes File.read(@app.path("app/controllers/streams_controller.rb")).lines.map(&:strip), unbuffered,
                    "the app's stream sends what DEPLOY.md says"
    stats = free_port
    write_streams_config(stats)
    sh = DOCS.block("docs/DEPLOY.md", section: NGINX_SECTION, lang: "sh", containing: "blackbuck ")
             .sub("/run/blackbuck", "#{@run}/blackbuck").sub("-w 4", "-w 1")
    *setup_lines, command = sh.text.lines.map { |l| l.sub(/\s+#.*/, "").strip }.reject(&:empty?)
    setup_lines.each { |l| assert system(l), "#{l} failed" }
    server = start_app(Snippet.new(command, "DEPLOY.md's command"), env: STREAMS_ENV)
    nginx = start_deploy_nginx("#{@run}/blackbuck/app.sock")
    check_stream(server, "http://127.0.0.1:#{nginx.port}", stats)
    refute_match(/\[(error|crit|alert|emerg)\]/, nginx.error_log)
  end

  # HUP re-reads config/blackbuck.rb: a TCP listener is added next to the socket and the socket's
  # mode changes, while the browser, through nginx, keeps its page and its Action Cable subscription.
  def test_hup_with_a_changed_listener_and_socket_mode_while_the_browser_keeps_working
    sock = write_readme_config
    server = start_app(production_command)
    nginx = start_deploy_nginx(sock)
    base = "http://127.0.0.1:#{nginx.port}"
    @browser.visit("#{base}/demo")
    wait_for_pings(1)

    port = free_port
    config = File.read(@app.path("config/blackbuck.rb"))
    changed = Snippet.new(config, "README's config/blackbuck.rb").sub("unix_socket_mode 0o660", "unix_socket_mode 0o666")
    File.write(@app.path("config/blackbuck.rb"), "#{changed}listen \"127.0.0.1:#{port}\"\n")
    old_workers = server.ready_pids
    log_before = server.log.size
    server.signal(:HUP)
    server.wait_for("the new listener after HUP") { server.log[log_before..].include?("listening on http://127.0.0.1:#{port}") }
    server.wait_for("#{WORKERS} new workers after HUP") { (server.ready_pids - old_workers).size >= WORKERS }
    server.wait_for("the socket's new mode") { (File.stat(sock).mode & 0o777) == 0o666 }
    assert_equal Etc.getgrnam(NginxSite::USER).gid, File.stat(sock).gid, "the group stays"

    # the open page: Action Cable comes back on a new worker and its subscription gets a broadcast again
    wait_for_pings(2)
    submit_note_with_turbo(base)
    check_in_browser("http://127.0.0.1:#{port}")
    check_in_browser(base)
    refute server.process.exited?, "the master (its pid kept by the re-exec) still runs"
  end

  # DEPLOY.md's Memory section (its warm-up and reforking config in config/blackbuck.rb, which the
  # `blackbuck` command reads without -c) behind nginx as DEPLOY.md sets it up. One browser keeps the
  # demo page and its Action Cable subscription open while another browses (pages with their assets,
  # the scaffold's form) and a plain client fetches /notes, until the server has reforked twice
  # (refork_after 50, 100): /status and the log say generation 2, its mold, and workers forked by it.
  def test_reforks_behind_nginx_with_deploy_md_memory_config_while_the_browser_keeps_working
    write_memory_config
    sh = DOCS.block("docs/DEPLOY.md", section: NGINX_SECTION, lang: "sh", containing: "blackbuck ").sub("/run/blackbuck", "#{@run}/blackbuck")
    *setup_lines, command = sh.text.lines.map { |l| l.sub(/\s+#.*/, "").strip }.reject(&:empty?)
    setup_lines.each { |l| assert system(l), "#{l} failed" }
    stats = free_port
    server = start_app(Snippet.new(command, "DEPLOY.md's command"), args: stats_listen_args(stats))
    assert_match(/INFO warm-up: 3 paths \(\/demo 200, \/notes 200, \/notes\.json 200\) and the warmup block in [\d.]+ s; Active Record pools disconnected/,
                 server.log)
    nginx = start_deploy_nginx("#{@run}/blackbuck/app.sock")
    check_through_reforks(server, "http://127.0.0.1:#{nginx.port}", stats)
    # Not counted: WebSockets reset as the workers that held them exit (nginx: "recv() failed
    # (104: Connection reset by peer) while proxying upgraded connection"): a retiring worker, or
    # the one that forked a mold, ends its WebSockets when it exits and Action Cable reconnects
    # them (asserted below). Every other failure counts.
    errors = nginx.error_log.lines.grep(/\[(error|crit|alert|emerg)\]/)
    assert_empty errors.reject { |l| l.include?("Connection reset by peer) while proxying upgraded connection") }, "nginx saw no upstream failure"
  end

  # The same behind HAProxy as DEPLOY.md sets it up (the PROXY protocol; its health checks count
  # as requests too), the config file being the HAProxy section's with the Memory section's added.
  def test_reforks_behind_haproxy_with_deploy_md_memory_config_while_the_browser_keeps_working
    port = free_port
    write_memory_config(DOCS.block("docs/DEPLOY.md", section: HAPROXY_SECTION, lang: "ruby").sub("10.0.0.5:8080", "127.0.0.1:#{port}"))
    stats = free_port
    server = start_app(production_command, args: stats_listen_args(stats))
    front = free_port
    cfg = DOCS.block("docs/DEPLOY.md", section: HAPROXY_SECTION, lang: "haproxy")
              .sub(/^(\s*bind ):80$/, "\\1127.0.0.1:#{front}")
              .sub(/10\.0\.0\.[56]:8080/, "127.0.0.1:#{port}")
    haproxy = HAProxyProcess.new(cfg.text, port: front)
    @stoppable << haproxy
    check_through_reforks(server, "http://127.0.0.1:#{front}", stats)
    refute_match(/\[(ALERT|WARNING)\]/, haproxy.log, "HAProxy marked no server down (its health checks ran through the reforks)")
  end

  private

  # config/blackbuck.rb of the streams tests: `streams` on, one worker with one app thread (a
  # command's -w wins over `workers`), the status listener on port stats.
  def write_streams_config(stats)
    File.write(@app.path("config/blackbuck.rb"), <<~RUBY)
      workers 1
      threads 1
      streams true
      stats_listen "127.0.0.1:#{stats}"
    RUBY
  end

  # The stream page (StreamsController) on base in the browser: Turbo appends the events of its
  # ActionController::Live stream as they come. While it is open, another browser loads a plain page
  # of the app (the layout, its assets, a query) from the same worker and thread, and /status counts
  # the open stream; events still come after that page has loaded. Then the suite tells the stream
  # to end (tmp/streams/TOKEN.end): its last event arrives, every event before it did, and the
  # browser saw the response end whole (not an error) and opened it once (the last event's `retry`
  # keeps the EventSource from opening it again within the test); /status counts no stream.
  # Without `streams` the plain page waits behind the stream, which ends only when told: it fails.
  def check_stream(server, base, stats)
    token = SecureRandom.hex(8)
    FileUtils.mkdir_p(@app.path("tmp/streams"))
    other = Chromium.new(Dir.mktmpdir("other", @run)) # started first: the stream stays open only as long as needed
    @stoppable << other
    @browser.visit("#{base}/stream?token=#{token}")
    events = -> { @browser.page.css("#events li.event").size }
    @browser.wait_for("the stream's Turbo Streams appended to the page", STREAM_BOUND) { events.call >= 2 }

    begin
      other.visit("#{base}/stream/plain?token=#{token}")
    rescue Ferrum::Error, RuntimeError => e # Ferrum's timeout, or Chromium#visit's wait for the load event
      flunk "a plain page did not load while the stream was open (#{e.class}: #{e.message.lines.first.strip}); " \
            "the stream page had #{events.call} events"
    end
    assert_empty other.failed_requests, "every request of the plain page is answered while the stream is open"
    assert other.js("[...document.styleSheets].some(s => /\\/assets\\/application[-.][^/]*css$/.test(s.href || ''))"),
           "the plain page's stylesheet is applied"
    assert_equal "fiber", other.text("#isolation"), "the app runs with isolation_level :fiber"
    refute @browser.page.at_css("#stream-end"), "the stream is still open when the plain page has loaded"
    loaded_at = events.call
    @browser.wait_for("events after the plain page loaded", STREAM_BOUND) { events.call > loaded_at }
    # (polled: the worker is busy for the moments its stream's body runs, between two waits)
    server.wait_for("/status: the one worker idle, with its open stream", STREAM_BOUND) do
      status_at(stats)["workers"].map { |w| [w["state"], w["streams"]] } == [["idle", 1]]
    end

    File.write(@app.path("tmp/streams/#{token}.end"), "")
    last = @browser.wait_for("the stream's last event", STREAM_BOUND) { @browser.page.at_css("#stream-end")&.text }
    sent = Integer(last[/\Atold to end after (\d+) events\z/, 1] || flunk("the stream's last event: #{last.inspect}"))
    @browser.wait_for("all #{sent} events on the page") { events.call == sent }
    assert_equal (1..sent).map { |i| "event #{i}" }, @browser.page.css("#events li.event").map { |li| li.text[/\Aevent \d+/] },
                 "every event, in order"
    streams = @browser.page.network.traffic.select { |ex| ex.request&.url&.include?("/stream/events") }
    assert_equal 1, streams.size, "the page opened the stream once"
    ex = @browser.wait_for("the end of the stream's response in the browser", STREAM_BOUND) { streams.first if streams.first.finished? }
    assert_nil ex.error&.error_text, "the stream's response ended whole (its last chunk), not with an error"
    assert_equal [200, "text/event-stream"], [ex.response.status, ex.response.content_type]
    server.wait_for("/status counts no stream once it ended", STREAM_BOUND) do
      status_at(stats)["workers"].map { |w| w["streams"] } == [0]
    end
  end

  # config/blackbuck.rb: DEPLOY.md's "Memory" examples, the warm-up's (with this app's paths and
  # model for the doc's /posts and Menu) and the reforking one, as written; after `before` if given.
  def write_memory_config(before = nil)
    warmup = DOCS.block("docs/DEPLOY.md", section: /Warm-up before fork/, lang: "ruby", containing: "warmup")
                 .sub('warmup "/", "/posts", "/posts.json"', 'warmup "/demo", "/notes", "/notes.json"')
                 .sub("Menu.build", "Note.count")
    refork = DOCS.block("docs/DEPLOY.md", section: /Reforking/, lang: "ruby", containing: "refork_after")
    assert_match(/^refork_after 50, 100, 1000\b/, refork.text, "the counts this test drives the server through")
    File.write(@app.path("config/blackbuck.rb"), [before, warmup, refork].compact.join("\n"))
  end

  # The status listener's flag of DEPLOY.md's "Status and metrics" command, on port.
  def stats_listen_args(port)
    flag = DOCS.command("docs/DEPLOY.md", section: STATUS_SECTION, pattern: /--stats-listen 127\.0\.0\.1:\d+/)
               .sub(/127\.0\.0\.1:\d+/, "127.0.0.1:#{port}").to_s[/--stats-listen \S+/]
    flag.split
  end

  # GET /status of the status listener on 127.0.0.1:port (DEPLOY.md: `curl -s http://127.0.0.1:9393/status`).
  def status_at(port) = JSON.parse(Net::HTTP.get(URI("http://127.0.0.1:#{port}/status")))

  # Browses base until the server (refork_after 50, 100, ...) has reforked twice and every worker is
  # of generation 2 and forked by its mold; then checks that /status, the log, the page kept open
  # since before the first refork (its Action Cable subscription) and a visitor see the same.
  def check_through_reforks(server, base, stats)
    watcher = Chromium.new(Dir.mktmpdir("watcher", @run))
    @stoppable << watcher
    watcher.visit("#{base}/demo")
    wait_for_pings(1, watcher)
    first = status_at(stats)
    # the master holds no app: the mold that booted it forked generation 0
    assert_equal [0, 0, true], [first.dig("refork", "generation"), first.dig("refork", "mold", "generation"),
                                first.dig("refork", "mold", "booted_app")]
    assert_equal ["mold"], first["workers"].map { |w| w["forked_by"] }.uniq

    http = Net::HTTP.start("127.0.0.1", URI(base).port)
    rounds = 0
    settled = server.wait_for("two reforks (generation 2 with every worker forked by its mold)", REFORK_BOUND) do
      rounds += 1
      browse_once(base)
      15.times { |i| assert_equal "200", http.get("/notes").code, "GET /notes ##{i} of round #{rounds}" }
      s = status_at(stats)
      s if s.dig("refork", "generation") == 2 && s.dig("refork", "mold") &&
           s["workers"].size == server.workers && s["workers"].all? { |w| w["generation"] == 2 && w["state"] != "starting" }
    end

    mold = settled.dig("refork", "mold", "pid")
    workers = settled["workers"].map { |w| w["pid"] }
    assert_equal({ "pid" => mold, "generation" => 2, "booted_app" => false }, settled.dig("refork", "mold"))
    assert_equal ["mold"], settled["workers"].map { |w| w["forked_by"] }.uniq, "every worker forked by the mold"
    assert_equal ["master", "mold", *["worker"] * workers.size], settled["processes"].map { |p| p["role"] }.sort
    assert_equal mold, settled["processes"].find { |p| p["role"] == "mold" }["pid"]
    assert_empty first["workers"].map { |w| w["pid"] } & workers, "every worker of generation 0 was replaced"
    log = server.log
    assert_match(/refork: worker \d \(pid \d+\) served \d+ requests \(refork_after 50\); it forks the mold of generation 1$/, log)
    assert_match(/refork: worker \d \(pid \d+\) served \d+ requests \(refork_after 100\); it forks the mold of generation 2$/, log)
    assert_match(/refork: mold of generation 2 is pid #{mold} \(forked by worker \d, pid \d+, which exits\)$/, log)
    assert_match(/previous mold \(pid \d+\) exited with status 0$/, log, "generation 1's mold is gone")

    # The page open since generation 0: its subscription answers a broadcast asked for now, within
    # the bound (at once, or once Action Cable has reconnected it), from a worker of generation 2:
    # the worker that held its WebSocket has exited (a mold keeps no copy of it, and has none of the
    # app's threads), so the page reconnected to one of them.
    token = "after reforks #{SecureRandom.hex(4)}"
    asked = nil
    watcher.wait_for("the answer to #{token.inspect} on the page kept open", CABLE_TIMEOUT) do
      if asked.nil? || now - asked > 1 # again while the connection may be reconnecting
        watcher.page.execute("import('channels/consumer').then(m => m.default.subscriptions.subscriptions.forEach(s => s.perform('shout', { text: #{token.to_json} })))")
        asked = now
      end
      watcher.page.css("#pings li").map(&:text).find { |t| t.start_with?("#{token} from ") }
    end
    answered = Integer(watcher.page.css("#pings li").map(&:text).find { |t| t.start_with?("#{token} from ") }[/from (\d+)\z/, 1])
    assert_includes workers, answered, "the page kept open is answered by a worker of generation 2, not by #{answered}"

    # A visitor now: everything, and its new page's Action Cable connection is held by a worker of generation 2.
    check_in_browser(base)
    pids = @browser.page.css("#pings li").map { |li| Integer(li.text[/from (\d+)\z/, 1]) }
    assert_empty pids - workers, "the visitor's broadcasts come from the worker of generation 2 that holds its WebSocket"
    if @redis # Rails 7.2: those broadcasts went through Redis, where a worker's listener is subscribed
      assert @redis.channels.any? { |c| c.end_with?("pings") }, "a listener on Redis subscribed to pings: #{@redis.channels.inspect}"
    end
    refute server.process.exited?
  ensure
    http&.finish if http&.started?
  end

  # One visitor's round: the page with the asset tags (every request answered), then the scaffold's
  # index, new and create (a form post with its CSRF token).
  def browse_once(base)
    @browser.visit("#{base}/demo")
    assert_empty @browser.failed_requests, "every request of #{base}/demo is answered"
    assert @browser.js("[...document.styleSheets].some(s => /\\/assets\\/application[-.][^/]*css$/.test(s.href || ''))"),
           "the stylesheet of stylesheet_link_tag is applied"
    submit_note_with_turbo(base)
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Skips when a prerequisite is absent on a developer's machine; fails under CI, where bin/setup
  # has installed them all.
  def require_prerequisites
    {
      "Chromium (apt-get install chromium)" => Chromium.path,
      "the suite's gem directory (BUNDLE_PATH; bin/setup installs gemfiles/browser.gemfile or browser8.gemfile, rake test:browser names it)" => GeneratedApp.gems_installed?,
      "nginx (apt-get install nginx-light)" => NginxSite.available?,
      "HAProxy (apt-get install haproxy)" => HAProxyProcess.available?,
      "root (nginx's `user www-data;`, a socket given to group www-data)" => Process.uid.zero?,
      "redis-server (apt-get install redis-server; Rails 7.2's Action Cable in production)" => !REDIS || RedisServer.available?
    }.each do |what, present|
      next if present

      flunk "missing under CI: #{what}" if ENV["CI"] == "true"
      skip "needs #{what}"
    end
  end

  # README's config/blackbuck.rb in the app, its socket in the stand-in for /run; returns the socket's path.
  def write_readme_config
    dir = "#{@run}/myapp"
    FileUtils.mkdir_p(dir, mode: 0o755)
    File.chmod(0o755, dir)
    config = DOCS.block("README.md", section: RAILS_SECTION, lang: "ruby", containing: "# config/blackbuck.rb")
                 .sub("/run/myapp/", "#{dir}/")
    File.write(@app.path("config/blackbuck.rb"), config.text)
    "#{dir}/blackbuck.sock"
  end

  # README: `RAILS_ENV=production bin/blackbuck -c config/blackbuck.rb`.
  def production_command = DOCS.command("README.md", section: RAILS_SECTION, pattern: %r{bin/blackbuck -c config/blackbuck\.rb})

  # Starts a command of the docs ("VAR=value ... cmd args") in the app's directory, in production
  # unless env says otherwise; waits for its workers.
  def start_app(snippet, args: [], env: {})
    words = Shellwords.split(snippet.to_s)
    vars = words.take_while { |w| w.match?(/\A\w+=/) }.to_h { |w| w.split("=", 2) }
    cmd = words.drop(vars.size)
    cmd[0] = @app.path("bin/blackbuck") if cmd[0] == "blackbuck" # the binstub `bundle binstubs blackbuck` made
    production = @app.production_env.merge(@redis ? { "REDIS_URL" => @redis.url } : {})
    full_env = (env["RAILS_ENV"] == "development" ? {} : production).merge("WEB_CONCURRENCY" => WORKERS.to_s, **vars, **env)
    # -w N; else WORKERS ($WEB_CONCURRENCY); without it, development's one
    workers = cmd.each_cons(2).find { |flag, _| flag == "-w" }&.last&.to_i || (full_env["WEB_CONCURRENCY"] ? WORKERS : 1)
    server = AppServer.new(@app, [*cmd, *args], env: full_env, workers: workers, name: "server-#{name}")
    @stoppable << server
    server
  end

  # DEPLOY.md's nginx site as written, its socket and port substituted.
  def start_deploy_nginx(sock)
    port = free_port
    site = DOCS.block("docs/DEPLOY.md", section: NGINX_SECTION, lang: "nginx")
               .sub("unix:/run/blackbuck/app.sock", "unix:#{sock}")
               .sub(/^(\s*listen )80;/, "\\1127.0.0.1:#{port};")
    nginx = NginxSite.new(site.text, port: port)
    @stoppable << nginx
    nginx
  end

  def free_port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }

  # Everything a visitor does, on base ("http://HOST:PORT"): the page and its assets (every request
  # answered; how fast is the machine's, not asserted), a broadcast over Action Cable, a send_file
  # download, a job the page enqueues (run by the adapter `jobs`), the scaffold's form, which Turbo
  # submits (with the CSRF token) and whose redirect it follows; and /up, Rails' health check.
  def check_in_browser(base, jobs: PRODUCTION_JOBS)
    @browser.visit("#{base}/demo")
    assert_empty @browser.failed_requests, "every request of #{base}/demo is answered"
    assert @browser.js("[...document.styleSheets].some(s => /\\/assets\\/application[-.][^/]*css$/.test(s.href || ''))"),
           "the stylesheet of stylesheet_link_tag is applied"
    assert @browser.js("!!document.querySelector('script[type=importmap]')"), "javascript_importmap_tags"
    @browser.wait_for("Turbo and Stimulus started by the importmap") { @browser.js("!!window.Turbo && !!window.Stimulus") }
    wait_for_pings(1)

    path = @browser.download("#download")
    assert_equal [GeneratedApp::DOWNLOAD_BYTES, @app.download_sha256], [File.size(path), Digest::SHA256.file(path).hexdigest],
                 "send_file arrived whole"
    FileUtils.rm_f(path)

    run_job_from_the_page(jobs)
    submit_note_with_turbo(base)
    assert_equal "200", Net::HTTP.get_response(URI("#{base}/up")).code, "GET /up"
  end

  # The page's button posts (Turbo, with the CSRF token) to DemoController#job, which enqueues
  # StampJob and redirects back; the job leaves tmp/jobs/TOKEN naming its adapter.
  def run_job_from_the_page(adapter)
    token = @browser.text("#job-token").strip
    @browser.turbo_click("#job")
    assert_equal token, @browser.text("#enqueued").strip, "Turbo followed the redirect after the job was enqueued"
    file = @app.path("tmp/jobs/#{token}")
    @browser.wait_for("job #{token} to run (#{adapter})", JOB_TIMEOUT) { File.exist?(file) }
    assert_equal adapter, File.read(file).split.last, "the adapter that ran the job"
  end

  # From the page at hand: the Notes index, "New note", the form filled in and submitted. Turbo
  # (not a full page load) submits it, with the CSRF token, and follows the redirect to the new note.
  def submit_note_with_turbo(base)
    @browser.turbo_click("#notes")
    assert_equal "#{base}/notes", @browser.url
    @browser.turbo_click("a[href='/notes/new']")
    assert @browser.page.at_css("form input[name=authenticity_token]"), "the form has its CSRF token"
    title = "note #{SecureRandom.hex(4)}"
    @browser.fill_in("#note_title", title)
    @browser.fill_in("#note_body", "written in Chromium")
    @browser.turbo_click("form [type=submit]")
    assert_match(%r{\A#{Regexp.escape(base)}/notes/\d+\z}, @browser.url, "redirected to the new note")
    assert_includes @browser.text("body"), "Note was successfully created."
    assert_includes @browser.text("body"), title
  end

  # Waits until #pings has n items: broadcasts the Ping channel's subscription received.
  def wait_for_pings(count, browser = @browser)
    browser.wait_for("#{count} Action Cable broadcast(s) on #{browser.url}", CABLE_TIMEOUT) do
      browser.page.css("#pings li").size >= count
    end
    assert_match(/\Ahello \d+ from \d+\z/, browser.page.css("#pings li").last.text)
  end

  # Sequential requests through nginx go over one upstream connection that stays open between
  # them: the map keeps Connection away from everything that is not a WebSocket upgrade.
  def assert_upstream_keepalive(nginx, sock)
    get = -> { Net::HTTP.get_response(URI("http://127.0.0.1:#{nginx.port}/up")) }
    assert_equal "200", get.call.code
    first = established(sock)
    refute_empty first, "nginx keeps its upstream connection open after a request"
    2.times { assert_equal "200", get.call.code }
    refute_empty first & established(sock), "the next requests use the connection kept open"
  end

  # Inodes of the connected (server-side) sockets of the UNIX socket at path.
  def established(path)
    File.readlines("/proc/net/unix").drop(1).filter_map do |l|
      f = l.split
      f[6] if f[7] == path && f[5] == "03"
    end
  end
end
