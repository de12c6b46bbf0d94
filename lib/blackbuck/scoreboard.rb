# frozen_string_literal: true

module Blackbuck
  module Native
    # The worker states kept in each scoreboard slot: their numbers are C's (bb_scoreboard.c defines
    # IDLE, BUSY and STOPPING on this class), their names for /status are here. request_start (C) sets
    # BUSY; the worker writes IDLE or STOPPING on request_done and tick.
    class Scoreboard
      NAMES = { IDLE => "idle", BUSY => "busy", STOPPING => "stopping" }.freeze

      # One slot as the master reads it (#read), frozen: pid (the worker that took the slot with
      # reset; the fork's predecessor's until then), state (IDLE, BUSY, STOPPING), requests served,
      # running_ms (the current request's age; 0 when none runs), heartbeat_age_ms (since the last
      # tick), connections, request_method and path (the request running, cut to fit; whatever ran
      # last when none runs), spill_bytes, streams (open streams: responses whose body waits on a fiber,
      # Streams). `request_method`, not `method`: that is Object#method.
      # The members are in C's order (bb_scoreboard.c, read_values).
      Slot = Struct.new(:pid, :state, :requests, :running_ms, :heartbeat_age_ms, :connections,
                        :request_method, :path, :spill_bytes, :streams)

      # read(i) -> slot i, a Slot. Read without a lock: a slot mid-update costs one stale sample.
      def read(index) = Slot.new(*read_values(index)).freeze
    end
  end
end
