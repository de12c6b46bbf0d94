# frozen_string_literal: true

module Blackbuck
  module Native
    # The worker states kept in each scoreboard slot: their numbers are C's (bb_scoreboard.c defines
    # IDLE, BUSY and STOPPING on this class), their names for /status are here. request_start (C) sets
    # BUSY; the worker writes IDLE or STOPPING on request_done and tick.
    class Scoreboard
      NAMES = { IDLE => "idle", BUSY => "busy", STOPPING => "stopping" }.freeze
    end
  end
end
