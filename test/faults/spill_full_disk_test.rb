# frozen_string_literal: true

require_relative "fault_helper"

# Issue 32: a request body spilled to a tempfile on a disk that fills up is answered 503 and the
# worker serves on (docs/SECURITY.md). It did answer 503, then crashed: a body arriving in pieces
# smaller than IO's 8 KiB buffer leaves bytes in the Tempfile's buffer, and `close!` flushes them
# outside any rescue, so every other connection of the worker was lost with it.
#
# The full disk is a file size limit (RLIMIT_FSIZE) on the server, with SIGXFSZ ignored: a write past
# it fails with EFBIG where a full disk fails with ENOSPC, through the same write and the same flush
# (no mount, no root). The limit is far above what the server's log grows to.
class SpillFullDiskTest < ServerTest
  FILE_LIMIT = 512 * 1024  # bytes any file the server writes may grow to
  BODY = 2 * 1024 * 1024   # bytes of the upload: past body_buffer (spilled) and past the limit
  PIECE = 4000             # bytes per write: under IO's 8 KiB buffer, so the Tempfile buffers them

  def start
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/file_limit.rb", <<~RUBY)
      trap("XFSZ", "IGNORE") # (inherited by the workers) a write past the limit fails with EFBIG
      Process.setrlimit(:FSIZE, #{FILE_LIMIT})
    RUBY
    rubyopt = [ENV.fetch("RUBYOPT", nil), "-r#{dir}/file_limit.rb"].compact.join(" ")
    start_server(["-l", "127.0.0.1:0"], dir: dir, env: { "RUBYOPT" => rubyopt })
  end

  # The upload, in pieces (paced so the worker reads them one by one); the answer, or nil when the
  # connection ended without one.
  def upload(server)
    io = server.tcp
    io.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: #{BODY}\r\n\r\n")
    piece = "b" * PIECE
    sent = 0
    begin
      while sent < BODY
        io.write(piece[0, [PIECE, BODY - sent].min])
        sent += PIECE
        sleep 0.0005 # pacing the client's writes (not waiting for a state): one piece per read
      end
    rescue Errno::EPIPE, Errno::ECONNRESET
      nil # the server answered and stopped reading
    end
    read_response(io)
  rescue Errno::ECONNRESET, EOFError
    nil
  ensure
    io&.close
  end

  def test_a_body_that_cannot_be_spilled_is_503_and_the_worker_serves_on
    server = start
    idle = server.tcp # a keep-alive connection of the same (only) worker, idle meanwhile
    assert_equal 200, request(idle, "GET", "/hello").status
    pid = server.worker_pids.first
    res = upload(server)
    assert_equal 503, res&.status, server.log
    assert_logged(server, /ERROR cannot buffer a request body: File too large/)
    assert_equal 200, request(idle, "GET", "/hello")&.status, "the idle connection is served on:\n#{server.log}"
    assert alive?(pid), "the worker is still there"
    assert_equal [pid], server.worker_pids, "no worker replaced it"
    refute_match(/exited with|exited on signal|Errno::EFBIG \(/, server.log)
  ensure
    idle&.close
  end
end
