# frozen_string_literal: true

module Blackbuck
  module Native
    # The worker states kept in each scoreboard slot (bb_scoreboard.c), named in one place.
    # request_start (C) sets BUSY; the worker writes IDLE or STOPPING on request_done and tick.
    class Scoreboard
      IDLE = 0
      BUSY = 2
      STOPPING = 4
      NAMES = { IDLE => "idle", BUSY => "busy", STOPPING => "stopping" }.freeze
    end
  end
end
