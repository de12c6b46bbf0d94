# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"
require "tmpdir"
require "fileutils"
require "timeout"

# Native::Conn's output queue over a UNIX socket pair, without a server: output the socket does
# not take goes to memory (response_buffer), then to a spill file in $TMPDIR (max_response_spill),
# in order; what no spill file takes is held in memory (BB_OUT_HELD_MAX for the process), and past
# that the write fails at once: it never waits for the client.
class ConnOutputTest < Minitest::Test
  Native = Blackbuck::Native
  RESPONSE_BUFFER = 64 * 1024
  WRITE_TIMEOUT_MS = 2000
  PARTS = 16 # of 64 KiB: 1 MiB, more than the socket and the memory queue hold

  def setup
    @dir = Dir.mktmpdir("bb-conn")
    @old_tmpdir = ENV.fetch("TMPDIR", nil)
    ENV["TMPDIR"] = @dir
    configure(max_spill: 4 * 1024 * 1024)
    @server = UNIXServer.new("#{@dir}/s")
    @client = UNIXSocket.new("#{@dir}/s")
    @conn = Native::Conn.accept(@server.fileno, {}, false)
  end

  def teardown
    @reader&.kill
    (@extra || []).each(&:close)
    @conn&.close
    @client&.close
    @server&.close
    @old_tmpdir ? ENV["TMPDIR"] = @old_tmpdir : ENV.delete("TMPDIR")
    Native.logger = nil
    Native.configure(Blackbuck::Config.new.values)
    FileUtils.rm_rf(@dir)
  end

  def test_memory_then_spill_file_then_interim_responses_in_order
    parts = write_parts
    assert @conn.write_continue
    assert @conn.write_hints({ "link" => "</a.css>; rel=preload" })
    assert @conn.pending_output?
    assert_equal 1, spill_fds, "a spill file in $TMPDIR"
    expected = parts.join << "HTTP/1.1 100 Continue\r\n\r\n" << "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"
    assert_equal expected, read_while_flushing(expected.bytesize)
    refute @conn.pending_output?
    assert_equal 0, spill_fds, "the spill file is closed once sent"
  end

  def test_without_spilling_the_rest_is_held_in_memory_and_keeps_the_order
    configure(max_spill: 0)
    @reader = start_reader(after: 0.3, bytes: PARTS * 65_536)
    t = now
    parts = write_parts
    assert_operator now - t, :<, 0.25, "past response_buffer it did not wait for the reader"
    assert @conn.pending_output?
    assert_equal 0, spill_fds
    flush_all
    assert_equal parts.join, @reader.value
  end

  HELD_PARTS = (64 * 1024 * 1024 / 65_536) + 64 # of 64 KiB: 4 MiB past BB_OUT_HELD_MAX

  def test_a_client_that_takes_nothing_fails_the_write_past_the_held_memory_at_once
    configure(max_spill: 0)
    t = now
    failed = (0...HELD_PARTS).find { |i| !@conn.write_part(part(i), false) } # Response stops at the first false
    refute_nil failed, "a write failed"
    assert_operator failed, :>=, HELD_PARTS - 64, "everything up to the held memory's limit was taken"
    assert_operator now - t, :<, WRITE_TIMEOUT_MS / 1000.0, "without waiting for the client"
  end

  def test_spill_failure_warns_once_and_holds_instead
    ENV["TMPDIR"] = File.join(@dir, "missing")
    warnings = []
    Native.logger = Struct.new(:list) { def warn(msg) = list << msg }.new(warnings)
    @reader = start_reader(after: 0.3, bytes: PARTS * 65_536)
    parts = write_parts
    flush_all
    assert_equal parts.join, @reader.value
    assert_equal 1, warnings.size, warnings.inspect
    assert_match(%r{\Acannot spill a response to #{Regexp.escape(@dir)}/missing \(open: No such file or directory\)},
                 warnings.first)
  end

  # max_worker_spill bounds the spill files of all of a worker's connections together: with the
  # first stalled client's file in place, a second one spills up to the cap and holds the rest in
  # memory, without waiting for its client; once the first file is gone, a third connection spills again.
  def test_the_worker_cap_counts_every_connections_spill_file
    configure(max_spill: 16 * 1024 * 1024, worker_spill: 2 * 1024 * 1024, write_timeout_ms: 300)
    write_parts # 1 MiB: what the socket and the 64 KiB memory queue do not hold is in a file
    assert_equal 1, spill_fds
    second = stalled_conn
    t = now
    assert (0...4 * PARTS).all? { |i| second.write_part(part(i), false) }, "past the worker cap, held in memory"
    assert_operator now - t, :<, 0.25, "without waiting for the client"
    assert_equal 2, spill_fds, "it spilled up to the cap first"
    second.close
    @conn.close
    assert_equal 0, spill_fds, "closing the connections removed their files and gave their room back"
    third = stalled_conn
    16.times { |i| assert third.write_part(part(i), false), "part #{i} spilled again" }
    assert_equal 1, spill_fds
  end

  # rack.hijack: the app writes to the socket itself, so what is queued goes out first.
  def test_detach_sends_what_is_queued_first
    parts = write_parts
    assert @conn.write_hints({ "link" => "</a.css>" })
    expected = parts.join << "HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n"
    @reader = start_reader(after: 0.2, bytes: expected.bytesize)
    io = UNIXSocket.for_fd(@conn.detach)
    assert_equal 0, spill_fds
    assert_equal expected, @reader.value
    io.close
  end

  # A file body (write_file) is the last segment of the queue: after memory and the spill file, in
  # order, closed once sent; nothing may be written behind it.
  def test_a_file_body_goes_after_memory_and_spill_and_nothing_behind_it
    path = File.join(@dir, "body.bin")
    File.binwrite(path, Random.new(1).bytes(3 * 1024 * 1024 + 5))
    parts = write_parts
    assert_equal 1, spill_fds
    assert_equal Native::Conn::WRITE_PENDING, @conn.write_file(200, { "content-type" => "x/y" }, path)
    assert_equal 1, fds_on(path), "the file is open while queued"
    err = assert_raises(RuntimeError) { @conn.write_part("more", false) }
    assert_match(/\A\[BUG\] output written behind a queued file body/, err.message)
    File.unlink(path) # sent from the open file all the same
    @reader = Thread.new do
      out = +""
      out << @client.readpartial(65_536) until (i = out.index("\r\n\r\n", parts.join.bytesize))
      out << @client.readpartial(65_536) while out.bytesize < i + 4 + (3 * 1024 * 1024) + 5
      out
    end
    flush_all
    got = @reader.value
    assert_equal parts.join, got.byteslice(0, parts.join.bytesize)
    head, body = got.byteslice(parts.join.bytesize..).split("\r\n\r\n", 2)
    assert_match(/\AHTTP\/1.1 200 [^\r]*\r\ncontent-type: x\/y\r\nContent-Length: #{3 * 1024 * 1024 + 5}\r\n/, head)
    assert_equal Random.new(1).bytes(3 * 1024 * 1024 + 5), body
    assert_equal 0, spill_fds + fds_on(path), "the spill file and the file body are closed once sent"
    assert @conn.write_part("after", false), "a new response may start once the file is out"
  end

  def test_closing_the_connection_closes_a_queued_file_body
    path = File.join(@dir, "body.bin")
    File.binwrite(path, "x" * (4 * 1024 * 1024))
    assert_equal Native::Conn::WRITE_PENDING, @conn.write_file(200, {}, path)
    assert_equal 1, fds_on(path)
    @conn.close
    assert_equal 0, fds_on(path)
  end

  # Not sendable from the file: nil, and nothing written (the caller streams the body instead).
  # A FIFO is refused at once, not waited on.
  def test_write_file_declines_what_it_cannot_send_from_the_file
    path = File.join(@dir, "body.bin")
    File.binwrite(path, "12345")
    File.mkfifo(fifo = File.join(@dir, "fifo"))
    assert_nil @conn.write_file(206, {}, path)
    assert_nil @conn.write_file(200, { "transfer-encoding" => "chunked" }, path)
    assert_nil @conn.write_file(200, { "Content-Length" => "4" }, path)
    assert_nil @conn.write_file(200, {}, File.join(@dir, "missing"))
    assert_nil @conn.write_file(200, {}, @dir)
    assert_nil Timeout.timeout(15) { @conn.write_file(200, {}, fifo) }
    assert_raises(ArgumentError) { @conn.write_file(200, { "x" => "a\r\nb" }, path) }
    assert_equal 0, fds_on(path) + fds_on(fifo)
    refute @conn.pending_output?
    assert_equal :wait_readable, @client.read_nonblock(1, exception: false), "nothing was written"
    assert_equal Native::Conn::WRITE_DONE, @conn.write_file(200, { "Content-Length" => "5" }, path)
    assert_match(/\AHTTP\/1.1 200 [^\r]*\r\nContent-Length: 5\r\n.*\r\n\r\n12345\z/m, @client.readpartial(4096))
  end

  private

  def fds_on(path)
    Dir.children("/proc/self/fd").count do |fd|
      File.readlink("/proc/self/fd/#{fd}").start_with?(path)
    rescue SystemCallError
      false
    end
  end

  def configure(max_spill:, worker_spill: 64 * 1024 * 1024, write_timeout_ms: WRITE_TIMEOUT_MS)
    Native.configure(Blackbuck::Config.new.values.merge(write_timeout: write_timeout_ms / 1000.0, response_buffer: RESPONSE_BUFFER,
                                                        max_response_spill: max_spill, max_worker_spill: worker_spill))
  end

  def stalled_conn
    (@extra ||= []) << UNIXSocket.new("#{@dir}/s")
    Native::Conn.accept(@server.fileno, {}, false).tap { |c| @extra << c }
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  def part(i) = format("%015d\n", i) * 4096

  def write_parts
    Array.new(PARTS) do |i|
      assert @conn.write_part(part(i), false), "part #{i}"
      part(i)
    end
  end

  def spill_fds
    Dir.children("/proc/self/fd").count do |fd|
      File.readlink("/proc/self/fd/#{fd}").start_with?("#{@dir}/")
    rescue SystemCallError
      false
    end
  end

  def start_reader(after:, bytes:)
    Thread.new do
      sleep after
      out = +""
      out << @client.readpartial(65_536) while out.bytesize < bytes
      out
    end
  end

  def flush_all
    deadline = now + 10
    sleep 0.001 until @conn.flush == Native::Conn::WRITE_DONE || now > deadline
    refute @conn.pending_output?
  end

  def read_while_flushing(bytes)
    @reader = start_reader(after: 0, bytes: bytes)
    flush_all
    @reader.value
  end
end
