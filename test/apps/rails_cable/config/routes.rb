# frozen_string_literal: true

Rails.application.routes.draw do
  get "pid" => "cable#pid"
  post "broadcast" => "cable#broadcast"
end
