# frozen_string_literal: true

require_relative "../test_helper"
require "json"

# Faults around the worker. (A worker killed with SIGKILL mid-request is respawned:
# covered in test/slow/process_test.rb.)
class FaultsTest < ServerTest
  # Bodies above body_buffer are spilled to a tempfile in Dir.tmpdir ($TMPDIR). On a full
  # disk that fails: the client gets 503 with Connection: close, the worker lives on and
  # serves the next request (also a small body, kept in memory).
  def test_full_disk_while_spilling_a_body_is_503_and_the_worker_lives_on
    skip "mounting a tmpfs needs root" unless Process.uid.zero?
    @tmpfs = Dir.mktmpdir("bb-tmpfs")
    unless system("mount", "-t", "tmpfs", "-o", "size=64k,mode=1777", "tmpfs", @tmpfs, err: File::NULL)
      skip "mount -t tmpfs is not permitted here"
    end

    server = start_server(["-l", "127.0.0.1:0"], app: "kitchen.ru", env: { "TMPDIR" => @tmpfs })
    pid_before = worker_pid_of(server)

    io = server.tcp
    body = "x" * 1_000_000
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: #{body.bytesize}\r\n\r\n")
    writer = Thread.new do
      io.write(body)
    rescue Errno::EPIPE, Errno::ECONNRESET
      nil # the server answered and closed before taking the whole body
    end
    res = read_response(io, timeout: 15)
    writer.join(15)
    refute_nil res, "no answer to the body that did not fit"
    assert_equal 503, res.status
    assert_equal "close", res["connection"]
    assert closed_by_peer?(io)
    assert_logged(server, /cannot buffer a request body: .*No space left on device/)

    assert_equal pid_before, worker_pid_of(server), "the same worker serves on: it did not crash"
    io2 = server.tcp
    assert_equal 200, request(io2, "GET", "/hello").status
    small = request(io2, "POST", "/echo", body: "fits in memory")
    assert_equal "fits in memory", small.body
    assert_equal [], Dir.children(@tmpfs), "no tempfile left behind"
    refute server.exited?
  ensure
    writer&.kill
    io&.close
    io2&.close
    (@servers || []).each(&:stop) # the server must be gone before the tmpfs is unmounted
    if @tmpfs
      system("umount", @tmpfs, err: File::NULL)
      Dir.rmdir(@tmpfs) if Dir.exist?(@tmpfs) && Dir.empty?(@tmpfs)
    end
  end

  private

  def worker_pid_of(server)
    io = server.tcp
    JSON.parse(request(io, "GET", "/env").body)["worker.pid"].to_i
  ensure
    io&.close
  end
end
