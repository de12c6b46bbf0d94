# frozen_string_literal: true

# A server of the generated app (bin/blackbuck or bin/rails server -u blackbuck) in the app's
# directory, as its log tells it: the addresses it listens on and the workers that said ready.
class AppServer
  BOOT_TIMEOUT = 120 # seconds: a bound for a boot that went wrong (Rails on a loaded machine boots slowly)

  attr_reader :process, :workers # workers: how many it waited for

  def initialize(app, cmd, env:, workers:, name:)
    @workers = workers
    @process = app.spawn(cmd, log_path: File.join(File.dirname(app.dir), "#{name}.log"), env: env)
    wait_for("#{workers} workers ready") { ready_pids.size >= workers }
  end

  def pid = @process.pid
  def log = @process.log
  def stop = @process.stop
  def signal(sig) = @process.signal(sig)

  # Pids of every worker that said "worker N (pid P) ready", in order.
  def ready_pids = @process.worker_pids

  # "http://127.0.0.1:PORT" or "unix:/path" of each "listening on" line, in order.
  def listening = log.scan(/listening on (\S+)/).flatten

  def wait_for(what, timeout = BOOT_TIMEOUT)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until (v = yield)
      raise "server exited (#{@process.status.inspect}) before #{what}:\n#{log}" if @process.exited?
      raise "#{what}: not within #{timeout}s:\n#{log}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
    v
  end
end
