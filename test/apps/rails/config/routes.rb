# frozen_string_literal: true

Rails.application.routes.draw do
  get "json" => "pages#json"
  post "login" => "pages#login"
  get "whoami" => "pages#whoami"
  get "invalid" => "pages#invalid"
  post "upload" => "pages#upload"
  get "download" => "pages#download"
  get "events" => "live#events"
  get "cached" => "pages#cached"
  get "boom" => "pages#boom"
  get "slow" => "pages#slow"
end
