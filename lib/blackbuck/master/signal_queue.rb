# frozen_string_literal: true

module Blackbuck
  # The master's signals, as Unicorn keeps them: a trap only pushes its signal onto the queue and
  # writes a byte to a self-pipe, so no work ever runs inside a trap; the master's loop selects on
  # #wake_io, then takes the signals one by one (#shift) in its own `case`.
  class SignalQueue
    attr_reader :names

    # names: the signals the master traps (Supervisor::SIGNALS).
    def initialize(names)
      @names = names
      @queue = []
      @wake_r, @wake_w = IO.pipe
    end

    # The master's traps: each one queues its signal and wakes the loop, nothing more.
    def trap_all = @names.each { |sig| trap(sig) { push(sig) } }

    # From a trap, from another thread (Server::Control#stop) or from the loop itself. An Array push
    # and a non-blocking write: both safe in a trap. A full pipe already wakes the loop.
    def push(sig)
      @queue << sig
      @wake_w.write_nonblock(".", exception: false)
    rescue IOError # a child forked from the master has closed the pipe (close_in_child), and a signal
      nil          # the master had received but not yet handled ran its trap in the child
    end

    def shift = @queue.shift

    # What is queued, left in the queue (a re-exec hands it to the new image).
    def pending = @queue.dup

    # Is one of sigs queued (a stop asked while a HUP's new code booted)?
    def queued?(sigs) = @queue.intersect?(sigs)

    # The pipe's read end: readable once a signal is queued.
    def wake_io = @wake_r

    # After the loop woke: the bytes that woke it, read so the next select sleeps again.
    def clear_wake = @wake_r.read_nonblock(1024, exception: false)

    # In a process forked from the master (a worker, the status stand-in): the pipe is the master's.
    def close_in_child = [@wake_r, @wake_w].each { |io| io.close unless io.closed? }
  end
end
