# frozen_string_literal: true

require_relative "../test_helper"

# USR1 after logrotate moved the --log file: the master and every worker open the file again and
# say so in it (issue 22, item 10: before, the reopen left no trace, so an operator could not tell
# whether the signal arrived).
class USR1LogTest < Minitest::Test
  WORKERS = 2

  def setup
    @dir = Dir.mktmpdir("bb-test")
    @log = File.join(@dir, "blackbuck.log")
    @server = ChildProcess.new([RbConfig.ruby, EXE, "-w", WORKERS.to_s, "--log", @log, "-l", "unix:#{@dir}/app.sock",
                                File.join(APPS, "hello.ru")], log_path: File.join(@dir, "stderr.log"))
  end

  def teardown
    @server.stop
    unless passed?
      Dir[File.join(@dir, "*.log*")].each { |f| warn "\n--- #{File.basename(f)} ---\n#{File.read(f)}--- end ---" }
    end
    FileUtils.rm_rf(@dir)
  end

  def read(path) = File.exist?(path) ? File.read(path) : ""

  def wait_for(what, timeout = 30)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until (v = yield)
      flunk "#{what}: not within #{timeout}s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      flunk "#{what}: the server exited" if @server.exited?
      sleep 0.05
    end
    v
  end

  def test_usr1_reopens_the_log_and_each_process_says_so_in_the_new_file
    workers = wait_for("#{WORKERS} workers ready") do # [[index, pid], ...]
      found = read(@log).scan(/worker (\d+) \(pid (\d+)\) ready/)
      found if found.size == WORKERS
    end
    File.rename(@log, "#{@log}.1") # what logrotate does
    @server.signal(:USR1)
    wait_for("the master's and every worker's line in the new file") do
      fresh = read(@log)
      fresh.include?("blackbuck[#{@server.pid}] INFO USR1: reopened log file #{@log}") &&
        workers.all? { |index, pid| fresh.include?("INFO worker #{index} (pid #{pid}) USR1: reopened log file #{@log}") }
    end
    refute_includes read("#{@log}.1"), "USR1", "the lines went to the new file"
    assert_empty read(File.join(@dir, "stderr.log")), "nothing on stderr with --log"
  end
end
