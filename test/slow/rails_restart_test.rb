# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# Two things a Rails 8 app expects of Puma, from Blackbuck's master: `bin/rails restart`
# (tmp/restart.txt) restarts the server as HUP does, and Solid Queue's supervisor (bin/jobs) runs
# beside the server when SOLID_QUEUE_IN_PUMA or solid_queue says so. A small fake bin/jobs stands
# for Solid Queue: it logs what happens to it in BB_JOBS_LOG.
class RailsRestartTest < ServerTest
  # Like Solid Queue's supervisor: TERM lets it finish the jobs it has (BB_JOBS_LINGER seconds),
  # then it exits 0.
  FAKE_JOBS = <<~RUBY
    #!#{RbConfig.ruby}
    log = ->(line) { File.write(ENV.fetch("BB_JOBS_LOG"), "\#{line}\\n", mode: "a") }
    version = File.read(File.expand_path("../version", __dir__)).strip
    log.("start \#{Process.pid} \#{version} mark=\#{ENV['BB_MARK']} dir=\#{Dir.pwd}")
    stop = false
    trap(:TERM) { stop = true }
    sleep 0.02 until stop
    log.("term \#{Process.pid}")
    sleep Float(ENV.fetch("BB_JOBS_LINGER", "0"))
    log.("done \#{Process.pid}")
  RUBY

  def app_dir(jobs: true, tmp: false)
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/version", "v1\n")
    File.write("#{dir}/config.ru", <<~RU)
      VERSION_NOW = File.read(File.join(__dir__, "version")).strip
      run ->(_env) { [200, { "content-type" => "text/plain" }, [VERSION_NOW]] }
    RU
    if jobs
      FileUtils.mkdir_p("#{dir}/bin")
      File.write("#{dir}/bin/jobs", FAKE_JOBS)
      File.chmod(0o755, "#{dir}/bin/jobs")
    end
    FileUtils.mkdir_p("#{dir}/tmp") if tmp
    dir
  end

  def jobs_lines(dir) = File.exist?("#{dir}/jobs.log") ? File.readlines("#{dir}/jobs.log", chomp: true) : []
  def started(dir) = jobs_lines(dir).grep(/\Astart /).map { |l| Integer(l.split[1]) }

  def start_app(dir, args = [], env: {}, workers: 1)
    start_server(["-l", "127.0.0.1:0", "-E", "production", *args], app: "#{dir}/config.ru", dir: dir, workers: workers,
                                                                    env: { "BB_JOBS_LOG" => "#{dir}/jobs.log" }.merge(env))
  end

  def get_body(server)
    io = server.tcp
    request(io, "GET", "/").body
  ensure
    io&.close
  end

  # Requests on new connections in a loop until stopped; [stats, stop].
  def load_in_background(server, max_seconds: 60)
    stats = { ok: 0, failed: [], bodies: Hash.new(0) }
    stop = false
    thread = Thread.new do
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + max_seconds
      until stop || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        begin
          io = server.tcp
          res = request(io, "GET", "/")
          raise "status #{res&.status.inspect}" unless res&.status == 200

          stats[:ok] += 1
          stats[:bodies][res.body] += 1
        rescue StandardError => e
          stats[:failed] << "#{e.class}: #{e.message}"
        ensure
          io&.close
        end
      end
    end
    [stats, -> { stop = true; thread.join }]
  end

  # `bin/rails restart` touches tmp/restart.txt: the new code serves, no request fails meanwhile.
  def test_touching_tmp_restart_txt_restarts_with_the_new_code
    dir = app_dir(jobs: false, tmp: true)
    server = start_app(dir, workers: 2)
    assert_equal "v1", get_body(server)
    stats, stop = load_in_background(server)
    wait_for(15) { stats[:ok] > 20 }
    File.write("#{dir}/version", "v2\n")
    FileUtils.touch("#{dir}/tmp/restart.txt")
    assert_logged(server, %r{#{Regexp.escape(dir)}/tmp/restart\.txt changed: restarting as HUP does})
    wait_for(60, "v2 served") { stats[:bodies]["v2"] > 20 }
    wait_for(30, "old workers gone") { server.log.scan(/old worker \(pid \d+\) exited/).size == 2 }
    stop.call
    assert_empty stats[:failed], "failed requests during the restart: #{stats[:failed].first(5)}"
    refute server.exited?

    # once more: the new image watches the file too (from the mtime that restarted it)
    File.write("#{dir}/version", "v3\n")
    FileUtils.touch("#{dir}/tmp/restart.txt", mtime: Time.now + 5)
    wait_for(60, "v3 served") { get_body(server) == "v3" }
    assert_equal 2, server.log.scan(/restart\.txt changed/).size
  end

  # The boot says which file it watches; none without a tmp/ directory, nor with --no-restart-file.
  def test_no_restart_file_without_tmp_or_when_off
    dir = app_dir(jobs: false, tmp: true)
    server = start_app(dir)
    assert_match(%r{restart file: #{Regexp.escape(dir)}/tmp/restart\.txt \(}, server.log)
    server.stop
    server = start_app(dir, ["--no-restart-file"])
    refute_match(/restart file:/, server.log)
    server = start_app(app_dir(jobs: false))
    refute_match(/restart file:/, server.log)
  end

  def test_solid_queue_in_puma_runs_bin_jobs_and_restarts_it_when_it_dies
    dir = app_dir
    server = start_app(dir, env: { "SOLID_QUEUE_IN_PUMA" => "1", "BB_MARK" => "from-the-server" })
    first = wait_for(30, "bin/jobs started") { started(dir).first }
    assert_match(%r{job runner bin/jobs started \(pid #{first}}, server.log)
    assert_includes jobs_lines(dir).first, "mark=from-the-server dir=#{File.realpath(dir)}", "the server's env, the app's directory"
    Process.kill(:KILL, first)
    second = wait_for(30, "bin/jobs restarted") { started(dir)[1] }
    refute_equal first, second
    assert_match(%r{job runner bin/jobs \(pid #{first}\) killed by SIGKILL after [\d.]+s; restarting it in 1s}, server.log)
    assert_equal "v1", get_body(server), "the web side serves on"
  end

  # TERM reaches bin/jobs, and the master waits for it to finish its jobs before it exits.
  def test_term_stops_bin_jobs_and_the_server_waits_for_it
    dir = app_dir
    server = start_app(dir, ["--solid-queue"], env: { "BB_JOBS_LINGER" => "1.5" })
    pid = wait_for(30, "bin/jobs started") { started(dir).first }
    server.signal(:TERM)
    assert server.wait_exit(30)&.success?, server.log
    assert_equal ["term #{pid}", "done #{pid}"], jobs_lines(dir).last(2), "the runner finished before the master exited"
    assert_match(/job runner \(pid #{pid}\) stopped \(exited with status 0\)/, server.log)
    refute alive?(pid)
  end

  # A runner that ignores TERM is killed after graceful_timeout.
  def test_a_runner_that_does_not_stop_is_killed_after_graceful_timeout
    dir = app_dir
    server = start_app(dir, ["--solid-queue", "--graceful-timeout", "1"], env: { "BB_JOBS_LINGER" => "60" })
    pid = wait_for(30, "bin/jobs started") { started(dir).first }
    server.signal(:TERM)
    assert server.wait_exit(30)&.success?, server.log
    assert_match(/job runner \(pid #{pid}\) still running after graceful_timeout; killing it/, server.log)
    refute alive?(pid)
  end

  # HUP: the runner is stopped and the new image starts bin/jobs with the new code.
  def test_hup_restarts_bin_jobs_with_the_new_code
    dir = app_dir
    server = start_app(dir, ["--solid-queue"], env: { "BB_JOBS_LINGER" => "0.5" })
    first = wait_for(30, "bin/jobs started") { started(dir).first }
    File.write("#{dir}/version", "v2\n")
    server.signal(:HUP)
    second = wait_for(60, "bin/jobs started again") { started(dir)[1] }
    assert_includes jobs_lines(dir).grep(/\Astart #{second} /).first, " v2 "
    wait_for(30, "the old runner reaped") { server.log.match?(/job runner \(pid #{first}\) stopped/) }
    assert_includes jobs_lines(dir), "done #{first}"
    wait_for(30) { get_body(server) == "v2" }
    server.signal(:TERM)
    assert server.wait_exit(30)&.success?, server.log
    refute alive?(second)
  end

  def test_asked_for_without_bin_jobs_refuses_to_start
    dir = app_dir(jobs: false)
    _out, err, status = Open3.capture3({ "SOLID_QUEUE_IN_PUMA" => "true" }, RbConfig.ruby, EXE, "-l", "127.0.0.1:0",
                                       "#{dir}/config.ru")
    assert_equal 1, status.exitstatus
    assert_equal 1, err.lines.size, err
    assert_match(%r{\Ablackbuck: \$SOLID_QUEUE_IN_PUMA asks for Solid Queue's supervisor, but #{Regexp.escape(dir)}/bin/jobs is missing}, err)
    File.write("#{dir}/blackbuck.rb", "solid_queue true\n")
    _out, err, status = Open3.capture3({ "SOLID_QUEUE_IN_PUMA" => nil }, RbConfig.ruby, EXE, "-c", "#{dir}/blackbuck.rb",
                                       "-l", "127.0.0.1:0", "#{dir}/config.ru")
    assert_equal 1, status.exitstatus
    assert_match(/\Ablackbuck: solid_queue asks for Solid Queue's supervisor/, err)
    # solid_queue false in the config file wins over the variable
    File.write("#{dir}/blackbuck.rb", "solid_queue false\n")
    server = start_server(["-c", "#{dir}/blackbuck.rb", "-l", "127.0.0.1:0"], app: "#{dir}/config.ru", dir: dir,
                                                                             env: { "SOLID_QUEUE_IN_PUMA" => "1" })
    refute_match(/job runner/, server.log)
  ensure
    FileUtils.rm_rf(dir) if dir
  end
end
