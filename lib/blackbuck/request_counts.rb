# frozen_string_literal: true

module Blackbuck
  # Requests served through each scoreboard slot since this master started. A worker's own count
  # lives in its slot and starts again at 0 when a new worker takes the slot, so the master adds
  # each worker's final count here when it reaps it. Supervisor#reap does that before
  # spawn_missing forks the slot's next worker (which resets the slot), and the shared memory
  # outlives the worker, so a worker killed by SIGKILL still counts every request it finished.
  # Per slot, exited + live never decreases while the master lives: blackbuck_requests_total.
  class RequestCounts
    def initialize(scoreboard)
      @scoreboard = scoreboard
      @exited = Hash.new(0) # slot index => requests served by the slot's workers that have exited
    end

    # Master: the worker `pid` of slot `index` has been reaped; its slot still holds its count.
    def worker_exited(index, pid)
      slot_pid, _state, requests = @scoreboard.read(index)
      # A worker that died before taking its slot left its predecessor's count there, added already.
      @exited[index] += requests if slot_pid == pid
    end

    # live: {slot index => requests of the slot's current worker}. Every slot that has served or
    # has a worker, in index order: {index => requests since the master started}.
    def per_slot(live)
      (@exited.keys | live.keys).sort.to_h { |i| [i, @exited[i] + live.fetch(i, 0)] }
    end
  end
end
