# frozen_string_literal: true

require_relative "../test_helper"
require "net/http"

# Real Solid Queue under Blackbuck's master, as Kamal runs a Rails 8 app (SOLID_QUEUE_IN_PUMA):
# the web side enqueues, the app's bin/jobs (Solid Queue's supervisor, spawned and supervised by
# the master) performs; HUP restarts it and jobs still run; TERM stops it and the master waits.
# test/apps/rails_jobs on SQLite; runs under gemfiles/rails8.gemfile (rake test:rails), skips
# where Solid Queue is not in the bundle.
class SolidQueueTest < ServerTest
  APP = File.join(APPS, "rails_jobs")

  def setup
    begin
      require "solid_queue/version"
      require "active_record"
    rescue LoadError
      skip "Solid Queue is not in this bundle (rake test:rails runs this file under gemfiles/rails8)"
    end
    @app_dir = Dir.mktmpdir("bb-test-jobs")
    FileUtils.cp_r("#{APP}/.", @app_dir)
    load_queue_schema("#{@app_dir}/db/queue.sqlite3")
  end

  def teardown
    super
    FileUtils.rm_rf(@app_dir) if @app_dir
  end

  # The queue database as `bin/rails db:prepare` makes it: the schema Solid Queue's installer writes
  # into db/queue_schema.rb, read from the installed gem.
  def load_queue_schema(database)
    schema = File.join(Gem.loaded_specs.fetch("solid_queue").full_gem_path,
                       "lib/generators/solid_queue/install/templates/db/queue_schema.rb")
    ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: database)
    ActiveRecord::Schema.verbose = false
    load schema
  ensure
    ActiveRecord::Base.connection_pool.disconnect!
  end

  def enqueue(server, name)
    path = "#{@app_dir}/#{name}"
    res = Net::HTTP.start("127.0.0.1", server.tcp_port, read_timeout: 20) { |h| h.post("/enqueue?path=#{path}", "") }
    assert_equal "200", res.code, res.body
    path
  end

  def runner_pids(server) = server.log.scan(%r{job runner bin/jobs started \(pid (\d+)}).flatten.map(&:to_i)

  def test_solid_queue_in_puma_performs_jobs_through_restarts_and_stops_with_the_server
    server = start_server(["-E", "production", "-l", "127.0.0.1:0"], app: "#{@app_dir}/config.ru", dir: @app_dir,
                                                                      env: { "SOLID_QUEUE_IN_PUMA" => "true" })
    first = wait_for(30, "bin/jobs started") { runner_pids(server).first }
    path = enqueue(server, "one")
    wait_for(90, "the job performed") { File.exist?(path) }
    performer = Integer(File.read(path)[/performed by (\d+)/, 1])
    refute_includes [server.pid, *server.worker_pids], performer, "a Solid Queue worker performed it, not the web side"

    server.signal(:HUP)
    second = wait_for(90, "bin/jobs started again") { runner_pids(server)[1] }
    refute_equal first, second
    wait_for(30, "the old runner stopped") { server.log.match?(/job runner \(pid #{first}\) stopped \(exited with status 0\)/) }
    wait_for(60, "new workers") { server.log.include?("new workers ready") }
    path = enqueue(server, "two")
    wait_for(90, "the job performed after HUP") { File.exist?(path) }

    server.signal(:TERM)
    assert server.wait_exit(60)&.success?, server.log
    assert_match(/job runner \(pid #{second}\) stopped \(exited with status 0\)/, server.log)
    refute alive?(second)
    refute alive?(Integer(File.read(path)[/performed by (\d+)/, 1])), "Solid Queue's worker went with its supervisor"
  end
end
