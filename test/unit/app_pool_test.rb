# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "timeout"

# AppPool alone (as Puma tests its ThreadPool): jobs in, done jobs out through the wake-up pipe,
# a queue the loop may take unstarted jobs back from, room only behind threads whose request is
# younger than a typical one, and a request timeout raised inside the app only.
class AppPoolTest < Minitest::Test
  AppPool = Blackbuck::AppPool
  Response = Blackbuck::Response
  WAIT = 10 # seconds a test waits for an app thread

  # Response#handle's stand-in: the app gets the env and answers the mode.
  class FakeResponse
    def initialize(_config, app, _logger, _hand_over) = @app = app
    def handle(_conn, env) = @app.call(env)
    def timeout_notice(limit) = Blackbuck::RequestTimeout.new("request ran longer than #{limit}s")
  end

  def pool(size, app)
    @pool = AppPool.new(Blackbuck::Logger.new(File.open(File::NULL, "w")), {}, app, size, response: FakeResponse)
  end

  def teardown
    @gate&.close
    @pool&.stop
  end

  def job(fd, env = {}) = AppPool::Job.new(:conn, fd, env, 0.0, nil, 1.0)

  def done(count)
    jobs = []
    Timeout.timeout(WAIT) do
      while jobs.size < count
        IO.select([IO.for_fd(@pool.wake_fd, autoclose: false)])
        @pool.each_done { |j| jobs << j }
      end
    end
    jobs
  end

  def blocking_app
    @gate = Queue.new
    @started = Queue.new
    lambda { |_env|
      @started << true
      @gate.pop
      Response::DONE
    }
  end

  def test_jobs_come_back_with_what_the_app_answered_and_their_times
    pool(2, ->(env) { env[:mode] })
    @pool.push(job(3, { mode: Response::CLOSE }))
    j = done(1).first
    assert_equal [3, Response::CLOSE], [j.fd, j.mode]
    assert_operator j.finished, :>=, j.started
    assert_operator @pool.typical, :>=, 0.0
  end

  def test_an_app_that_raises_gives_the_connection_back_to_be_dropped
    pool(1, ->(_env) { raise "boom" })
    @pool.push(job(3))
    assert_equal Response::DROP, done(1).first.mode
  end

  def test_only_jobs_no_thread_started_can_be_taken_back
    pool(1, blocking_app)
    @pool.push(job(1))
    Timeout.timeout(WAIT) { sleep 0.001 until @pool.oldest }
    @pool.push(job(2))
    @pool.push(job(3))
    assert_equal 1.0, @pool.oldest_waiting
    offered = []
    @pool.take_back do |j|
      offered << j.fd
      j.fd == 3
    end
    assert_equal [2, 3], offered
    3.times { @gate << :go }
    assert_equal [1, 2], done(2).map(&:fd) # 3 left the queue
  end

  def test_room_only_behind_threads_running_a_request_younger_than_a_typical_one
    pool(2, blocking_app)
    @pool.push(job(0)) # one request, so there is a typical run time
    @gate << :go
    done(1)
    @started.pop
    2.times { |i| @pool.push(job(i + 1)) }
    Timeout.timeout(WAIT) { 2.times { @started.pop } } # both run theirs
    assert @pool.room?(0.0) # seen from when they were young: one may wait behind each
    refute @pool.room?(Process.clock_gettime(Process::CLOCK_MONOTONIC) + 3600) # held by slow ones
    2.times { @gate << :go }
    done(2)
  end

  def test_a_request_timeout_reaches_only_a_request_past_the_limit
    pool(1, ->(_env) { sleep WAIT })
    @pool.push(job(1, { "REQUEST_METHOD" => "GET", "PATH_INFO" => "/slow" }))
    Timeout.timeout(WAIT) { sleep 0.001 until @pool.oldest }
    assert_equal %w[GET /slow], @pool.oldest.drop(1)
    refute @pool.time_out_oldest(3600) # not yet
    assert @pool.time_out_oldest(0)
    assert_equal Response::RETIRE_DROP, done(1).first.mode
    assert_nil @pool.oldest
  end
end
