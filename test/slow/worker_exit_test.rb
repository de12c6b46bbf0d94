# frozen_string_literal: true

require_relative "../test_helper"

# A worker that stops (TERM, a recycle, a HUP's handover) flushes what the app wrote to $stdout:
# Rails in production logs there, and `exit!` alone would drop the buffer with the worker.
class WorkerExitTest < ServerTest
  def test_a_stopping_worker_flushes_what_the_app_logged_to_stdout
    server = start_server(["-l", "127.0.0.1:0"], app: "stdout_log.ru", workers: 1)
    io = server.tcp
    assert_equal 200, request(io, "GET", "/first").status
    assert_equal 200, request(io, "GET", "/last").status
    io.close
    server.signal(:TERM)
    assert server.wait_exit(20)&.success?, server.log
    assert_match(%r{app logged /first\napp logged /last\n}, server.log)
  end
end
