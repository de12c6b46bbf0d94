# frozen_string_literal: true

require_relative "../messages"

module Blackbuck
  # The master's worker processes: this image's (a Child per pid, each in its scoreboard slot) and,
  # after a HUP re-exec, the previous image's (pid => control pipe, nil once told to stop), each
  # listed until it is reaped. It tells them to stop (a message on their control pipe), signals
  # them and reaps them; what an exit means (replace, wait, give up) is Respawn's.
  class Children
    include Enumerable

    # index: its scoreboard slot; control: the write end of its control pipe; ready: it has taken
    # its slot (booted) since it was forked (Respawn#booted); generation: the refork generation it
    # belongs to (Refork; 0 without reforking); origin: who forked it, :master or :mold.
    Child = Struct.new(:index, :pid, :control, :started_at, :ready, :generation, :origin)

    # old_workers: pid => control IO (or nil), the workers a previous image handed over (Reexec).
    def initialize(scoreboard, logger, old_workers = {})
      @scoreboard = scoreboard
      @logger = logger
      @workers = {} # pid => Child
      @old = old_workers.to_h
    end

    # This image's workers (the previous image's are only stopped, signalled and reaped).
    def each(&) = @workers.each_value(&)

    def size = @workers.size
    def [](pid) = @workers[pid]
    def add(child) = @workers[child.pid] = child

    # Every worker process, the previous image's included.
    def pids = @workers.keys + @old.keys
    def all_gone? = @workers.empty? && @old.empty?

    # The slot is the fork's until the worker resets it: then it is in its loop.
    def started?(child) = @scoreboard.read(child.index).pid == child.pid

    # The slots of workers that have started: the ones whose numbers are live.
    def live_slots = select { |c| started?(c) }.map(&:index)

    # As many workers as wanted, and every one in its loop.
    def all_started?(wanted) = size >= wanted && all? { |c| started?(c) }

    # A worker serves, or the previous image's still do (a HUP re-exec).
    def serving? = @old.any? || any? { |c| started?(c) }

    # After a re-exec, until the previous image's workers are told to stop.
    def handing_over? = @old.each_value.any? { |io| io && !io.closed? }

    # [[pid, control IO or nil], ...] of every worker, for the next image (Reexec.exec!).
    def for_exec = @workers.map { |pid, c| [pid, c.control] } + @old.to_a

    # message: a control message (Messages::STOP, FORCE, PROMOTE, RETIRE), on the worker's control pipe.
    def tell_stop(child, message = Messages::STOP)
      Messages.tell(child.control, message) unless child.control.closed?
    rescue IOError, SystemCallError
      nil
    end

    def tell_all(message = Messages::STOP) = each { |c| tell_stop(c, message) }

    # The previous images' workers that still have a control pipe are told to finish and exit;
    # each stays listed (without its pipe) until it is reaped. How many were told.
    def stop_old
      told = 0
      @old.each do |pid, io|
        next if io.nil?

        begin
          Messages.tell(io, Messages::STOP) unless io.closed?
          told += 1
        rescue IOError, SystemCallError
          nil
        end
        io.close unless io.closed?
        @old[pid] = nil
      end
      told
    end

    # Any process of the master's (a worker, the status stand-in, the job runner); one already gone
    # is no error.
    def self.signal(sig, pid)
      Process.kill(sig, pid)
    rescue Errno::ESRCH
      nil
    end

    def signal(sig, pid) = Children.signal(sig, pid)

    def signal_all(sig) = pids.each { |pid| signal(sig, pid) }

    # In a process forked from the master: the control pipes are the master's.
    def close_in_child
      each { |c| c.control.close unless c.control.closed? }
      @old.each_value { |io| io.close unless io.nil? || io.closed? }
    end

    # Every worker that has exited, without waiting: one of the previous image's is logged and
    # forgotten; one of this image's is forgotten (its pipe closed) and yielded with its
    # Process::Status. Any other child (a mold, Refork) goes to others with its status; others may
    # return a Child: a worker this list did not hold yet (Refork#reaped), yielded as the others.
    def reap(others: nil)
      loop do
        pid, status = Process.wait2(-1, Process::WNOHANG)
        break unless pid

        if @old.key?(pid)
          old = @old.delete(pid)
          old.close unless old.nil? || old.closed?
          @logger.info("old worker (pid #{pid}) exited")
        end
        child = @workers.delete(pid) || others&.call(pid, status)
        next unless child.is_a?(Child)

        child.control.close unless child.control.closed?
        yield child, status
      rescue Errno::ECHILD
        break
      end
    end
  end
end
