# frozen_string_literal: true

class CableController < ActionController::Base
  skip_forgery_protection # the test posts without a form
  # GET /pid: the worker that answers.
  def pid
    render plain: Process.pid.to_s
  end

  # POST /broadcast?text=T: "T from PID" to every subscriber of "room", through the adapter.
  def broadcast
    ActionCable.server.broadcast("room", { "text" => "#{params[:text]} from #{Process.pid}" })
    render plain: Process.pid.to_s
  end
end
