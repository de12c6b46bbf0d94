# frozen_string_literal: true

# Every subscriber hears every broadcast to "room"; the confirmation comes once the adapter has
# subscribed (Redis: once its listener's SUBSCRIBE is answered).
class RoomChannel < ApplicationCable::Channel
  def subscribed
    stream_from "room"
  end
end
