# frozen_string_literal: true
# A small Rails API app: one controller action that renders JSON, with Rails' API middleware
# stack, in the production environment (eager loading, no per-request logging). The same file for
# every server, on the Rails of the run's Ruby (the harness's RailsStack): Debian's Rails 6.1 on
# Rack 2.2 on Ruby 3.1 (peers through RUBYOPT=-r lib/rack2.rb, Blackbuck through
# gemfiles/rails61.gemfile), Rails 8.1 on Rack 3.1 on 3.4 and 4.0 (lib/rack31.rb,
# gemfiles/rails8.gemfile). BENCH_RAILS is the version the peers activate.
ENV["RAILS_ENV"] = "production"
unless defined?(Bundler) # outside a bundle: that Rails, not another one in the gem path
  %w[activesupport actionpack railties].each { |name| gem name, ENV.fetch("BENCH_RAILS", "~> 6.1.0") }
  Gem.finish_resolve # pin their dependencies now (else a later require may pick Rails 7's)
end
require "logger" # Rails 6.1 with concurrent-ruby >= 1.3.5 needs it loaded first
require "rails"
require "action_controller/railtie"

class BenchRailsApp < Rails::Application
  config.load_defaults Rails::VERSION::STRING.to_f # 6.1 or 8.1: each Rails' own defaults
  config.root = File.join(__dir__, "rails")
  config.api_only = true
  config.eager_load = true
  config.secret_key_base = "blackbuck-bench-" * 8
  config.hosts.clear
  config.logger = Logger.new($stderr, level: :warn)
  config.log_level = :warn
  config.consider_all_requests_local = false
end

class ItemsController < ActionController::API
  ITEMS = (1..10).map { |i| { id: i, name: "item #{i}", price_cents: i * 250, tags: %w[a b] } }.freeze

  def index
    render json: { items: ITEMS, count: ITEMS.size, page: (params[:page] || 1).to_i }
  end
end

BenchRailsApp.initialize!
BenchRailsApp.routes.draw do # after initialize!, which would replace routes drawn before it
  root "items#index"
end

require_relative "lib/bench_stats"
BenchStats.wrap(self)
run BenchRailsApp
