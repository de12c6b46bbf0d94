# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# What a Rails 8 app's Dockerfile and Kamal's deploy.yml hand the server in its environment
# (PORT, WEB_CONCURRENCY including auto, RAILS_MAX_THREADS, PIDFILE), read by the blackbuck
# command as Rails' generated config/puma.rb reads them; the command line and the config file win.
class RailsEnvTest < ServerTest
  BASE_ENV = { "PORT" => nil, "WEB_CONCURRENCY" => nil, "RAILS_MAX_THREADS" => nil, "PIDFILE" => nil,
               "SOLID_QUEUE_IN_PUMA" => nil }.freeze

  # exe/blackbuck with env (no -w: the environment says how many), ready once `workers` are.
  def start_with_env(env, *args, workers:)
    dir = Dir.mktmpdir("bb-test")
    server = ChildProcess.new([RbConfig.ruby, EXE, *args, File.join(APPS, "hello.ru")],
                              log_path: "#{dir}/server.log", env: BASE_ENV.merge(env))
    (@children ||= []) << [server, dir]
    wait_for(60, "#{workers} workers ready") do
      flunk("server exited:\n#{server.log}") if server.exited?
      server.log.scan(/worker \d+ \(pid \d+\) ready/).size >= workers
    end
    [server, dir]
  end

  def teardown
    super
    (@children || []).each do |server, dir|
      server.stop
      warn "\n--- server log (#{name}) ---\n#{server.log}--- end ---" unless passed?
      FileUtils.rm_rf(dir)
    end
  end

  def cpus = Integer(`#{RbConfig.ruby} -I#{ROOT}/lib -e 'require "blackbuck/config"; print Blackbuck::Config.cpus'`)

  def test_port_web_concurrency_auto_rails_max_threads_and_pidfile
    port = free_port
    pidfile = File.join(Dir.mktmpdir("bb-test"), "server.pid")
    server, = start_with_env({ "PORT" => port.to_s, "WEB_CONCURRENCY" => "auto", "RAILS_MAX_THREADS" => "3",
                               "PIDFILE" => pidfile }, "-o", "127.0.0.1", workers: cpus)
    assert_match(/#{cpus} workers \(\$WEB_CONCURRENCY=auto\) x 3 app threads \(\$RAILS_MAX_THREADS\)/, server.log)
    assert_equal cpus, server.worker_pids.size
    assert_equal "#{server.pid}\n", File.read(pidfile), "PIDFILE names the master"
    io = TCPSocket.new("127.0.0.1", port)
    assert_equal 200, request(io, "GET", "/").status
    io.close
    server.stop
    refute File.exist?(pidfile), "the pid file goes with the master"
  ensure
    FileUtils.rm_rf(File.dirname(pidfile)) if pidfile
  end

  # The command line wins over the environment (as over config/puma.rb's ENV.fetch lines).
  def test_the_command_line_wins
    pidfile = File.join(Dir.mktmpdir("bb-test"), "cli.pid")
    server, = start_with_env({ "WEB_CONCURRENCY" => "3", "RAILS_MAX_THREADS" => "4", "PIDFILE" => "#{pidfile}.env" },
                             "-l", "127.0.0.1:0", "-w", "1", "--threads", "2", "-P", pidfile, workers: 1)
    assert_match(/, 1 worker x 2 app threads, /, server.log)
    assert_equal "#{server.pid}\n", File.read(pidfile)
    refute File.exist?("#{pidfile}.env")
    assert_equal 1, server.worker_pids.size
  ensure
    FileUtils.rm_rf(File.dirname(pidfile)) if pidfile
  end

  def test_bad_values_name_the_variable
    {
      { "WEB_CONCURRENCY" => "many" } => /\Ablackbuck: \$WEB_CONCURRENCY must be an integer 1\.\.4096 or auto, got "many"\n\z/,
      { "RAILS_MAX_THREADS" => "0" } => /\Ablackbuck: \$RAILS_MAX_THREADS must be an integer 1\.\.256, got "0"\n\z/,
      { "PORT" => "http" } => /\Ablackbuck: \$PORT must be an integer 0\.\.65535, got "http"\n\z/
    }.each do |env, pattern|
      _out, err, status = Open3.capture3(BASE_ENV.merge(env), RbConfig.ruby, EXE, File.join(APPS, "hello.ru"))
      assert_equal 1, status.exitstatus, err
      assert_match pattern, err
    end
  end
end
