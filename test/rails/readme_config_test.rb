# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../browser/doc_snippets"
require "net/http"
require "json"

# Issue 32, items 4 and 8: README's config/blackbuck.rb, as written, in a real Rails app
# (test/apps/rails) under `bin/rails server -u blackbuck`, in every environment. In development it
# must be what Rails' generated config/puma.rb is: Rails' -b/-p (localhost:3000 by default), no
# request timeout (a `debugger` prompt), one process (development's Action Cable adapter, async,
# broadcasts within a process). In production it serves on its socket, with $WEB_CONCURRENCY a
# count or `auto`. `rake test:rails` runs it under each Rails of the Ruby running it.
class ReadmeConfigTest < ServerTest
  APP = File.join(APPS, "rails")
  RAILS_PORT = 3000 # rails server's default port
  BOOT_TIMEOUT = 60 # seconds: a bound for a Rails boot that went wrong

  def setup
    begin
      require "rails/version"
    rescue LoadError
      skip "Rails is not in this bundle (rake test:rails runs this file under gemfiles/rails*)"
    end
    @app_dir = Dir.mktmpdir("bb-test-readme")
    FileUtils.cp_r("#{APP}/.", @app_dir)
    @run = Dir.mktmpdir("bb-test-run") # stands for /run
    @rails = []
  end

  def teardown
    @rails&.each do |r|
      r.stop
      warn "\n--- rails server log (#{name}) ---\n#{r.log}--- end ---" unless passed?
    end
    super
    FileUtils.rm_rf([@app_dir, @run].compact)
  end

  # `bin/rails server -u blackbuck` with nothing else: localhost:3000, as without the file. Port
  # 3000 must be free on 127.0.0.1 (what this test is about: Rails' default address).
  def test_development_serves_rails_default_address_with_the_readme_config
    skip "port #{RAILS_PORT} is in use here" unless free?(RAILS_PORT)
    write_readme_config
    rails = start_rails({ "RAILS_ENV" => "development" })
    assert_includes listening(rails), "http://127.0.0.1:#{RAILS_PORT}", "Rails' default address, not the production socket"
    assert_equal "200", Net::HTTP.get_response(URI("http://127.0.0.1:#{RAILS_PORT}/json")).code
  end

  # With -p (as a developer might), and no WEB_CONCURRENCY: one worker, no request timeout.
  def test_development_is_one_worker_without_a_timeout
    write_readme_config
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    rails = start_rails({ "RAILS_ENV" => "development" }, "-b", "127.0.0.1", "-p", port.to_s)
    assert_equal ["http://127.0.0.1:#{port}"], listening(rails)
    assert_match(/Blackbuck \S+ \(development\), 1 worker \(the default in development\), /, rails.log)
    assert_match(/request timeout: off \(the default in development/, rails.log)
    res = Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/json"))
    assert_equal ["200", "world"], [res.code, JSON.parse(res.body)["hello"]]
  end

  # Production: the socket of the README (its directory substituted), WEB_CONCURRENCY=auto (one per CPU).
  def test_production_serves_the_socket_with_web_concurrency_auto
    sock = write_readme_config(run_dir: "#{@run}/myapp")
    rails = start_rails({ "RAILS_ENV" => "production", "WEB_CONCURRENCY" => "auto" })
    assert_equal ["unix:#{sock}"], listening(rails)
    assert_match(/\(production\), \d+ workers? \(\$WEB_CONCURRENCY=auto\)/, rails.log)
    assert_match(/request timeout: 30s/, rails.log)
    io = UNIXSocket.new(sock)
    assert_equal 200, request(io, "GET", "/json").status
  ensure
    io&.close
  end

  private

  # README's config/blackbuck.rb into the app; run_dir: made to stand for /run/myapp, else the
  # file is written as it is (development must not need /run/myapp). Returns the socket's path.
  def write_readme_config(run_dir: nil)
    config = DocSnippets.new(ROOT).block("README.md", section: /Rails \(and Sinatra\)/, lang: "ruby",
                                                      containing: "# config/blackbuck.rb")
    if run_dir
      FileUtils.mkdir_p(run_dir)
      config = config.sub("/run/myapp/", "#{run_dir}/")
    end
    File.write("#{@app_dir}/config/blackbuck.rb", config.text)
    "#{run_dir}/blackbuck.sock"
  end

  # `bin/rails server -u blackbuck ARGS` in the app, in env alone (no WEB_CONCURRENCY, PORT or
  # RACK_ENV from this process); waits for `workers` ready workers.
  def start_rails(env, *args, workers: 1)
    clean = { "WEB_CONCURRENCY" => nil, "PORT" => nil, "RACK_ENV" => nil, "RAILS_ENV" => nil, "RAILS_MAX_THREADS" => nil }
    rails = ChildProcess.new([RbConfig.ruby, "bin/rails", "server", "-u", "blackbuck", *args],
                             log_path: "#{@run}/rails-#{@rails.size}.log", chdir: @app_dir, env: clean.merge(env))
    @rails << rails
    wait_for(BOOT_TIMEOUT, "#{workers} workers ready") do
      flunk("rails server exited:\n#{rails.log}") if rails.exited?
      rails.worker_pids.size >= workers
    end
    rails
  end

  def listening(rails) = rails.log.scan(/listening on (\S+)/).flatten.uniq

  def free?(port)
    TCPServer.open("127.0.0.1", port).close
    true
  rescue SystemCallError
    false
  end
end
