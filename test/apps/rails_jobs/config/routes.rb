# frozen_string_literal: true

Rails.application.routes.draw do
  post "/enqueue", to: "jobs#enqueue"
end
