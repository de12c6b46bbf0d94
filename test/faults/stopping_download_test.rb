# frozen_string_literal: true

require_relative "fault_helper"

# Issue 32, item 15: a worker that begins to stop while a keep-alive response is still on its way
# (a slow reader's download) keeps its promise. Its client, which reads for seconds after the last
# byte went to the kernel, sends its next request on that connection and gets an answer: a retiring
# worker (TTOU, refork, recycle) moves the connection to a sibling once the response is out; a
# worker that stops without siblings to take it (HUP handover) keeps it for that next request and
# answers it with "Connection: close". It used to close the connection 1 s after the last byte went
# to the kernel: every such download's next request met EOF.
class StoppingDownloadFaultTest < FaultTest
  def start(threads, *args, dir: Dir.mktmpdir("bb-test"))
    start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", "--threads", threads.to_s, *args],
                 app: "faults.ru", workers: 2, dir: dir)
  end

  # Slow readers only (TCP and UNIX), each download ~3 s: whenever the stop begins, each is mid-way.
  # 6 MiB is more than the kernel's largest TCP send buffer (tcp_wmem's 4 MiB) and 2 MB/s slow
  # enough that the client reads for seconds after the last byte has gone to the kernel.
  STOPPING_DOWNLOAD_BYTES = 6 * 1024 * 1024
  def downloads(server) = load_on(server, keepalive: 0, fresh: 0, downloads: 4, rate: SLOW_DOWNLOAD_RATE,
                                          bytes: STOPPING_DOWNLOAD_BYTES)

  [1, 4].each do |threads|
    define_method("test_ttou_during_downloads_loses_nothing_threads_#{threads}") do
      server = start(threads)
      server.signal(:TTIN)
      wait_for(60) { server.worker_pids.size >= 3 }
      load = downloads(server)
      load.wait_ok(4)
      server.signal(:TTOU)
      wait_log(server, /stopping: asked by master to retire/)
      load.wait_ok(8)
      load.stop
      assert_nothing_lost(load)
    end

    define_method("test_hup_handover_during_downloads_loses_nothing_threads_#{threads}") do
      server = start(threads)
      load = downloads(server)
      load.wait_ok(4)
      server.signal(:HUP)
      wait_log(server, /new workers ready; \d+ old workers finishing/)
      load.wait_ok(8)
      load.stop
      assert_nothing_lost(load)
      refute server.exited?
    end
  end

  # A recycled worker (max_requests_per_child) retires while its other downloads are on their way.
  def test_recycling_during_downloads_loses_nothing
    server = start(1, "--max-requests-per-child", "6")
    load = downloads(server)
    wait_log(server, /exiting after \d+ requests/, 2, timeout: 90)
    load.stop
    assert_nothing_lost(load)
  end
end
