# frozen_string_literal: true

# Server-sent events with ActionController::Live: each event must reach the client when it is
# written, not when the action ends.
class LiveController < ApplicationController
  include ActionController::Live

  def events
    response.headers["Content-Type"] = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no" # nginx: pass events on at once
    # Rack 2.2's Rack::ETag (in Rails 6.1's stack) reads a 200 body whole to digest it unless it
    # has an ETag or a Last-Modified: any server would then send the events at the end.
    response.headers["Last-Modified"] = Time.now.httpdate
    3.times do |i|
      response.stream.write("data: event #{i}\n\n")
      sleep 0.4
    end
  ensure
    response.stream.close
  end
end
