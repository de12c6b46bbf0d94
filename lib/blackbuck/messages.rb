# frozen_string_literal: true

require "socket"

module Blackbuck
  # Every message one of Blackbuck's processes sends another, each a named type with its one
  # encoder and decoder here: no other file splits, sends or receives their bytes. Four channels,
  # each with one writer and one reader (docs/ARCHITECTURE.md, "Reforking"):
  #
  #   a worker's control pipe (master -> worker): STOP, FORCE, PROMOTE, RETIRE, one byte each
  #   the announcement line (SEQPACKET, a worker or a mold -> master): MoldReady (with the mold's
  #     socket), Unsafe
  #   the mold's socket (SEQPACKET, master <-> mold): SpawnRequest (with the worker's control pipe),
  #     Spawned, SpawnFailed
  #   the crash pipe (a crashing worker or booting mold -> master): Crash, one line
  #
  # The bytes are short text: a verb and its fields, space-separated, a free-text why last. Each
  # message is one datagram or one write (a pipe write up to PIPE_BUF is atomic), so a reader never
  # sees half of one. A decoder never raises: what it cannot read is an Unknown (its text kept for
  # the log), and the file descriptors that came with it are closed.
  module Messages
    DATAGRAM_MAX = 512    # bytes of a datagram on the announcement line or the mold's socket (longer ones are cut)
    WHY_MAX = 400         # bytes of the why in a datagram (Unsafe, SpawnFailed)
    CRASH_WHY_MAX = 1000  # bytes of a Crash's why: the line stays under PIPE_BUF (4096), so one write is atomic
    CONTROL_READ_MAX = 64 # bytes a worker reads off its control pipe at once
    CRASH_READ_MAX = 65_536 # bytes the master reads off the crash pipe at once

    # The master to a worker, on its control pipe: one byte each (what the worker does: Worker#on_control).
    Control = Struct.new(:name, :byte)
    STOP = Control.new(:stop, "q").freeze         # finish what is in flight, then exit
    FORCE = Control.new(:force, "f").freeze       # close every connection now and exit (a second Ctrl-C)
    PROMOTE = Control.new(:promote, "m").freeze   # refork_after: stop serving and fork the mold (Mold)
    RETIRE = Control.new(:retire, "r").freeze     # a new worker replaces this one; the siblings serve on
    # A worker busy in its app reads the bytes the master wrote meanwhile together: the first of
    # these among them is the message.
    CONTROLS = [FORCE, STOP, PROMOTE, RETIRE].freeze
    # Not a message but a signal, from the master after STOP when the whole server stops: a worker
    # whose app is running closes its listeners at once (Worker#stop_accepting_in_app).
    STOP_ACCEPTING_SIGNAL = :URG

    # On the announcement line. A mold is ready: its pid and the socket it listens on (SCM_RIGHTS);
    # worker_pid and index: the worker that forked it and its slot, or nil for the mold that booted
    # the app. Wire: "mold PID [WORKER_PID INDEX]".
    MoldReady = Struct.new(:pid, :socket, :worker_pid, :index)
    # A worker (pid) must not be forked: why (Blackbuck.no_longer_fork_safe!, a failed after_refork).
    # Wire: "unsafe PID WHY".
    Unsafe = Struct.new(:pid, :why)

    # On the mold's socket. The master asks for the worker of slot index, with the read end of its
    # control pipe (SCM_RIGHTS). Wire: "fork INDEX".
    SpawnRequest = Struct.new(:index, :control)
    # The mold's answers: the worker of slot index is pid (said by the middle process); or it could
    # not be forked, and why. Wire: "spawned INDEX PID", "failed INDEX WHY".
    Spawned = Struct.new(:index, :pid)
    SpawnFailed = Struct.new(:index, :why)

    # On the crash pipe: why the process pid failed, for the master's log line when it is reaped.
    # Wire: "PID WHY\n".
    Crash = Struct.new(:pid, :why)

    # What a decoder could not read: the bytes it got.
    Unknown = Struct.new(:text)

    module_function

    # message's bytes and the IOs that go with them (SCM_RIGHTS).
    def encode(message)
      case message
      when Control then [message.byte, []]
      when MoldReady
        from = " #{message.worker_pid} #{message.index}" if message.worker_pid
        ["mold #{message.pid}#{from}", [message.socket]]
      when Unsafe then ["unsafe #{message.pid} #{one_line(message.why, WHY_MAX)}", []]
      when SpawnRequest then ["fork #{message.index}", [message.control]]
      when Spawned then ["spawned #{message.index} #{message.pid}", []]
      when SpawnFailed then ["failed #{message.index} #{one_line(message.why, WHY_MAX)}", []]
      when Crash then ["#{message.pid} #{one_line(message.why, CRASH_WHY_MAX)}\n", []]
      else raise ArgumentError, "[BUG] not a message: #{message.inspect}"
      end
    end

    # A datagram's message (ios: the IOs that came with it; those it does not take are closed), or Unknown.
    def decode(text, ios = [])
      verb, rest = text.split(" ", 2)
      io = ios.first
      message = case verb
                when "mold"
                  pid, worker_pid, index, extra = numbers(rest, 4)
                  MoldReady.new(pid, io, worker_pid, index) if pid && io && worker_pid.nil? == index.nil? && extra.nil?
                when "unsafe"
                  pid, why = number_and_why(rest)
                  Unsafe.new(pid, why.to_s) if pid
                when "fork"
                  index, extra = numbers(rest, 2)
                  SpawnRequest.new(index, io) if index && io && extra.nil?
                when "spawned"
                  index, pid, extra = numbers(rest, 3)
                  Spawned.new(index, pid) if pid && extra.nil?
                when "failed"
                  index, why = number_and_why(rest)
                  SpawnFailed.new(index, why.to_s) if index
                end
      taken = message.to_a # (nil.to_a: none)
      ios.each { |other| other.close unless taken.any? { |field| field.equal?(other) } || other.closed? }
      message || Unknown.new(text)
    end

    # The bytes a worker read off its control pipe: the first of CONTROLS among them, or Unknown.
    def decode_control(bytes) = CONTROLS.find { |c| bytes.include?(c.byte) } || Unknown.new(bytes)

    # A line of the crash pipe: a Crash, or Unknown.
    def decode_crash(line)
      pid, why = number_and_why(line.chomp)
      why ? Crash.new(pid, why) : Unknown.new(line)
    end

    # Sends message as one datagram, waiting for room; raises what sendmsg raises.
    def send_datagram(socket, message)
      text, ios = encode(message)
      socket.sendmsg(text.byteslice(0, DATAGRAM_MAX), 0, nil, *rights(ios))
    end

    # As #send_datagram, never waiting: a socket without room raises (IO::EAGAINWaitWritable).
    def send_datagram_nonblock(socket, message)
      text, ios = encode(message)
      socket.sendmsg_nonblock(text.byteslice(0, DATAGRAM_MAX), 0, nil, *rights(ios))
    end

    # The next datagram's message (or Unknown), waiting for it; nil when the other end closed.
    def receive(socket) = received(socket.recvmsg(DATAGRAM_MAX, 0, nil, scm_rights: true))

    # As #receive, never waiting: :wait_readable when nothing is there.
    def receive_nonblock(socket)
      got = socket.recvmsg_nonblock(DATAGRAM_MAX, 0, nil, scm_rights: true, exception: false)
      got == :wait_readable ? got : received(got)
    end

    # Writes a control message or a Crash to a pipe in one write, never waiting: its result
    # (bytes written, or :wait_writable on a full pipe: the message is not sent).
    def tell(io, message)
      text, = encode(message)
      io.write_nonblock(text, exception: false)
    end

    # What the master wrote on the control pipe since the worker last looked, never waiting:
    # its message (#decode_control), :wait_readable, or nil when the master is gone.
    def receive_control(io)
      bytes = io.read_nonblock(CONTROL_READ_MAX, exception: false)
      bytes.is_a?(String) ? decode_control(bytes) : bytes
    end

    # Every line on the crash pipe, never waiting: Crash (or Unknown) messages.
    def receive_crashes(io)
      crashes = []
      while (data = io.read_nonblock(CRASH_READ_MAX, exception: false)).is_a?(String)
        data.each_line { |line| crashes << decode_crash(line) }
      end
      crashes
    end

    # ---- helpers

    def rights(ios) = ios.map { |io| Socket::AncillaryData.unix_rights(io) }

    # recvmsg's answer: nil (the other end closed: nil, or an empty datagram) or the message.
    def received(got)
      text, _addr, _flags, *controls = got
      ios = controls.flat_map { |c| (c.unix_rights if c.cmsg_is?(:SOCKET, :RIGHTS)) || [] }
      return decode(text, ios) unless text.nil? || text.empty?

      ios.each(&:close)
      nil
    end

    # "N N ...", at most count words: each a number (digits only), or [] when one is not.
    def numbers(text, count)
      numbers = text.to_s.split(" ", count).map { |word| number(word) }
      numbers.all? ? numbers : []
    end

    # "N WHY": [N, WHY] (WHY nil when there is none), or [] when N is not a number.
    def number_and_why(text)
      word, why = text.to_s.split(" ", 2)
      (n = number(word)) ? [n, why] : []
    end

    def number(word) = word&.match?(/\A[0-9]+\z/) ? word.to_i : nil

    # text on one line, at most max bytes (invalid bytes replaced: tr would raise on them).
    def one_line(text, max) = text.to_s.byteslice(0, max).scrub.tr("\n", " ")

    private_class_method :rights, :received, :numbers, :number_and_why, :number, :one_line
  end
end
