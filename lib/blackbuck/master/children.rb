# frozen_string_literal: true

require_relative "../messages"

module Blackbuck
  # The master's children, each with a role and a named state, listed until it is reaped: this
  # image's workers (a Child per pid, each in its scoreboard slot), the molds (a MoldChild per pid:
  # reforking, Refork) and, after a HUP re-exec, the previous image's workers (pid => control pipe,
  # nil once told to stop). It tells workers to stop (a message on their control pipe, which sets
  # their state), signals them and reaps every child; what an exit means (replace, wait, give up)
  # is Respawn's, and a mold's Refork's.
  class Children
    include Enumerable

    # A worker's states: forked (:starting) until it has taken its slot (:serving), then what the
    # master last told it: fork the mold (:promoting), retire (:retiring), stop (:stopping); or,
    # once the mold it forked has announced itself, :leaving (it exits).
    WORKER_STATES = %i[starting serving promoting retiring leaving stopping].freeze
    # What each control message makes of the worker told it (Messages::Control).
    TOLD = { promote: :promoting, retire: :retiring, stop: :stopping, force: :stopping }.freeze

    # index: its scoreboard slot; control: the write end of its control pipe; ready: it has taken
    # its slot (booted) since it was forked (Respawn#booted); generation: the refork generation it
    # belongs to (Refork; 0 without reforking); origin: who forked it, :master or :mold; state: one
    # of WORKER_STATES.
    Child = Struct.new(:index, :pid, :control, :started_at, :ready, :generation, :origin, :state) do
      def initialize(*)
        super
        self.state ||= :starting
      end

      def role = :worker
    end

    # A mold's states: loading the app (:booting, the mold Forker#booting_mold forks), the mold
    # workers are forked from (:serving; one at most), told to stop or killed (:stopping).
    MOLD_STATES = %i[booting serving stopping].freeze

    # pid; socket: the master's end of the mold's socket (nil while booting); generation: the
    # workers it forks belong to it; booted: it loaded the app itself (else a worker forked it).
    MoldChild = Struct.new(:pid, :socket, :generation, :booted, :state) do
      def role = :mold
    end

    # old_workers: pid => control IO (or nil), the workers a previous image handed over (Reexec).
    def initialize(scoreboard, logger, old_workers = {})
      @scoreboard = scoreboard
      @logger = logger
      @workers = {} # pid => Child
      @molds = {}   # pid => MoldChild
      @old = old_workers.to_h
    end

    # This image's workers (the previous image's are only stopped, signalled and reaped).
    def each(&) = @workers.each_value(&)

    def size = @workers.size
    def [](pid) = @workers[pid]
    def add(child) = @workers[child.pid] = child
    def delete(pid) = @workers.delete(pid)

    # Every worker process, the previous image's included.
    def pids = @workers.keys + @old.keys
    def all_gone? = @workers.empty? && @old.empty?

    # The slot is the fork's until the worker resets it: then it is in its loop (a :starting
    # worker is :serving from then on).
    def started?(child)
      return false unless @scoreboard.read(child.index).pid == child.pid

      child.state = :serving if child.state == :starting
      true
    end

    # The first of this image's workers in state, or nil.
    def in_state(state) = find { |c| c.state == state }

    # The worker told to fork the mold said it cannot (Messages::Unsafe): it serves on.
    def serves_on(pid)
      child = @workers[pid]
      child.state = :serving if child&.state == :promoting
    end

    # The mold pid forked from a worker has announced itself: that worker exits.
    def leaving(pid)
      child = @workers[pid]
      child.state = :leaving if child
    end

    # The molds: the one workers fork from (:serving), the one loading the app (:booting), and
    # those told to stop, until each is reaped.
    def add_mold(mold) = @molds[mold.pid] = mold
    def mold = @molds.each_value.find { |m| m.state == :serving }
    def booting_mold = @molds.each_value.find { |m| m.state == :booting }

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

    # message: a control message (Messages::STOP, FORCE, PROMOTE, RETIRE), on the worker's control
    # pipe; the worker's state says what it was told.
    def tell_stop(child, message = Messages::STOP)
      # (a worker forking the mold, or whose mold is there, is no retiring one: TTOU's RETIRE keeps it so)
      child.state = TOLD.fetch(message.name) unless message == Messages::RETIRE && %i[promoting leaving].include?(child.state)
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

    # In a process forked from the master: the control pipes and the molds' sockets are the master's.
    def close_in_child
      each { |c| c.control.close unless c.control.closed? }
      @molds.each_value { |m| m.socket.close unless m.socket.nil? || m.socket.closed? }
      @old.each_value { |io| io.close unless io.nil? || io.closed? }
    end

    # Every child that has exited, without waiting: one of the previous image's workers is logged and
    # forgotten; one of this image's is forgotten (its pipe closed) and yielded with its
    # Process::Status. Any other child goes to others with its status and, for a mold, its
    # MoldChild (forgotten here: Refork#reaped); others may return a Child: a worker this list did
    # not hold yet (Refork#reaped), yielded as the others.
    def reap(others: nil)
      loop do
        pid, status = Process.wait2(-1, Process::WNOHANG)
        break unless pid

        if @old.key?(pid)
          old = @old.delete(pid)
          old.close unless old.nil? || old.closed?
          @logger.info("old worker (pid #{pid}) exited")
        end
        child = @workers.delete(pid) || others&.call(pid, status, @molds.delete(pid))
        next unless child.is_a?(Child)

        child.control.close unless child.control.closed?
        yield child, status
      rescue Errno::ECHILD
        break
      end
    end
  end
end
