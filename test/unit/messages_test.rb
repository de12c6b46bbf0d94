# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "socket"

# Every message between Blackbuck's processes through its one codec, over the channels that carry
# it (SEQPACKET pairs, pipes): each type comes back as it was sent, file descriptors included, on
# the wire as before the codec (so nothing about sizes or atomicity changed), and what is not a
# message is refused (Unknown), never raised.
class MessagesCodecTest < Minitest::Test
  M = Blackbuck::Messages

  def setup
    @ios = []
  end

  def teardown = @ios.each { |io| io.close unless io.closed? }

  def keep(*ios) = ios.each { |io| @ios << io }.then { ios.size == 1 ? ios.first : ios }

  def pair = keep(*Socket.pair(:UNIX, :SEQPACKET))
  def pipe = keep(*IO.pipe)

  # sent over a real socket pair: the message the other end decodes
  def round_trip(message)
    ours, theirs = pair
    M.send_datagram(ours, message)
    M.receive(theirs)
  end

  # What arrives as a datagram (raw text, maybe with an fd), decoded.
  def raw(text, io = nil)
    ours, theirs = pair
    ours.sendmsg(text, 0, nil, *(Socket::AncillaryData.unix_rights(io) if io))
    M.receive_nonblock(theirs)
  end

  # the same open file, in two descriptors: one is the other's SCM_RIGHTS copy
  def same_file?(a, b) = a.stat.ino == b.stat.ino && a.stat.dev == b.stat.dev

  def test_a_mold_announcement_round_trips_with_its_socket
    socket, far = pair
    got = round_trip(M::MoldReady.new(500, socket, 100, 3))
    keep(got.socket)
    assert_equal [500, 100, 3], [got.pid, got.worker_pid, got.index]
    assert same_file?(socket, got.socket)
    got.socket.sendmsg("hello", 0) # the mold's own socket: the master talks to it over the copy
    assert_equal "hello", far.recv(16)

    booted = round_trip(M::MoldReady.new(400, socket))
    keep(booted.socket)
    assert_equal [400, nil, nil], [booted.pid, booted.worker_pid, booted.index]
  end

  def test_a_spawn_request_round_trips_with_the_control_pipe
    r, w = pipe
    got = round_trip(M::SpawnRequest.new(2, r))
    keep(got.control)
    assert_equal 2, got.index
    w.write(M.encode(M::STOP).first)
    assert_equal M::STOP, M.receive_control(got.control), "the worker's pipe: what the master writes, it reads"
  end

  def test_the_messages_without_descriptors_round_trip
    [M::Unsafe.new(100, "it started a thread"), M::Spawned.new(1, 4242), M::SpawnFailed.new(1, "Errno::EAGAIN: try again"),
     M::Unsafe.new(7, "")].each do |message|
      assert_equal message, round_trip(message)
    end
  end

  def test_control_messages_round_trip_on_a_pipe_one_byte_each
    r, w = pipe
    [M::STOP, M::FORCE, M::PROMOTE, M::RETIRE].each do |message|
      assert_equal 1, M.tell(w, message)
      assert_equal message, M.receive_control(r)
    end
    assert_equal :wait_readable, M.receive_control(r)
    w.close
    assert_nil M.receive_control(r), "the master is gone"
  end

  # A worker busy in its app reads what the master wrote meanwhile at once: the strongest counts.
  def test_control_bytes_read_together_mean_the_strongest
    assert_equal M::FORCE, M.decode_control("qrmf")
    assert_equal M::STOP, M.decode_control("rmq")
    assert_equal M::PROMOTE, M.decode_control("rm")
    assert_equal M::RETIRE, M.decode_control("rr")
    assert_equal M::Unknown.new("x"), M.decode_control("x")
  end

  def test_crash_reports_round_trip_on_a_pipe_one_line_each
    r, w = pipe
    M.tell(w, M::Crash.new(101, "the worker raised RuntimeError: boom"))
    M.tell(w, M::Crash.new(102, "two\nlines"))
    assert_equal [M::Crash.new(101, "the worker raised RuntimeError: boom"), M::Crash.new(102, "two lines")],
                 M.receive_crashes(r)
    assert_equal [], M.receive_crashes(r)
  end

  # The bytes on the wire are those the processes sent before the codec.
  def test_the_wire_is_as_before
    socket, = pair
    r, = pipe
    assert_equal ["mold 500 100 3", [socket]], M.encode(M::MoldReady.new(500, socket, 100, 3))
    assert_equal ["mold 400", [socket]], M.encode(M::MoldReady.new(400, socket))
    assert_equal ["unsafe 100 it started a thread", []], M.encode(M::Unsafe.new(100, "it started a thread"))
    assert_equal ["fork 2", [r]], M.encode(M::SpawnRequest.new(2, r))
    assert_equal ["spawned 1 4242", []], M.encode(M::Spawned.new(1, 4242))
    assert_equal ["failed 1 RuntimeError: boom", []], M.encode(M::SpawnFailed.new(1, "RuntimeError: boom"))
    assert_equal ["101 boom\n", []], M.encode(M::Crash.new(101, "boom"))
    assert_equal %w[q f m r], [M::STOP, M::FORCE, M::PROMOTE, M::RETIRE].map { |c| M.encode(c).first }
    assert_equal :URG, M::STOP_ACCEPTING_SIGNAL
  end

  # A why is one line, within its limit, however long or broken the text it came from.
  def test_a_why_is_one_line_within_its_limit
    long = "é\n" * 1000
    text, = M.encode(M::Unsafe.new(1, long))
    assert_operator text.bytesize, :<=, "unsafe 1 ".bytesize + M::WHY_MAX + 2 # (a cut character: U+FFFD)
    refute_includes text, "\n"
    assert_equal "unsafe 1 x\uFFFD", M.encode(M::Unsafe.new(1, "x\xFF".b.force_encoding("UTF-8"))).first
    crash, = M.encode(M::Crash.new(1, long))
    assert_operator crash.bytesize, :<, 4096, "under PIPE_BUF: one write"
    assert_equal 1, crash.count("\n")
    assert_equal M::SpawnFailed.new(3, "x" * M::WHY_MAX), round_trip(M::SpawnFailed.new(3, "x" * 10_000))
  end

  def test_every_datagram_fits_the_receivers_buffer
    socket, = pair
    [M::MoldReady.new(4_194_304, socket, 4_194_304, 4095), M::Unsafe.new(4_194_304, "x" * 10_000),
     M::SpawnRequest.new(4095, socket), M::Spawned.new(4095, 4_194_304), M::SpawnFailed.new(4095, "x" * 10_000)].each do |m|
      assert_operator M.encode(m).first.bytesize, :<=, M::DATAGRAM_MAX, m.class.name
    end
  end

  def test_malformed_datagrams_are_refused
    ["", "mold", "mold x", "mold 5 6", "mold 5 6 7 8", "mold -5", "unsafe", "unsafe x why", "fork", "fork x",
     "spawned 1", "spawned 1 x", "spawned 1 2 3", "spawned -1 2", "failed", "failed x why", "hello 1 2",
     "spawned\x001 2", "\xFF\xFE"].each do |text|
      assert_equal M::Unknown.new(text.b), M.decode(text.b), text.inspect
    end
  end

  def test_a_message_that_needs_a_descriptor_is_refused_without_one
    assert_equal M::Unknown.new("mold 500"), raw("mold 500")
    assert_equal M::Unknown.new("fork 1"), raw("fork 1")
  end

  # The descriptors that came with what was refused, or with a message that takes none, are closed,
  # not leaked: copies of a pipe's write end that stayed open would keep its reader from its end.
  def test_descriptors_a_message_does_not_take_are_closed
    r, w = pipe
    ours, theirs = pair
    ours.sendmsg("fork x", 0, nil, Socket::AncillaryData.unix_rights(w))
    _text, _addr, _flags, rights = theirs.recvmsg(M::DATAGRAM_MAX, 0, nil, scm_rights: true)
    copy = rights.unix_rights.first
    assert_equal M::Unknown.new("fork x"), M.decode("fork x", [copy])
    assert copy.closed?
    ours.sendmsg("spawned 1 2", 0, nil, Socket::AncillaryData.unix_rights(w))
    assert_equal M::Spawned.new(1, 2), M.receive(theirs)
    ours.sendmsg("hello", 0, nil, Socket::AncillaryData.unix_rights(w))
    assert_equal M::Unknown.new("hello"), M.receive(theirs)
    w.close
    assert_nil r.read_nonblock(1, exception: false), "every copy of the write end is closed"
  end

  def test_a_closed_peer_is_nil_and_nothing_waiting_is_wait_readable
    ours, theirs = pair
    assert_equal :wait_readable, M.receive_nonblock(theirs)
    ours.close
    assert_nil M.receive_nonblock(theirs)
    assert_nil M.receive(theirs)
  end

  def test_malformed_crash_lines_are_refused
    assert_equal M::Unknown.new("boom\n"), M.decode_crash("boom\n")
    assert_equal M::Unknown.new("x boom\n"), M.decode_crash("x boom\n")
    assert_equal M::Unknown.new("101\n"), M.decode_crash("101\n")
    r, w = pipe
    w.write("garbage\n101 boom\n")
    assert_equal [M::Unknown.new("garbage\n"), M::Crash.new(101, "boom")], M.receive_crashes(r)
  end

  def test_only_messages_are_encoded
    assert_raises(ArgumentError) { M.encode("q") }
  end
end
