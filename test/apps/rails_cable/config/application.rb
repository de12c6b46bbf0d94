# frozen_string_literal: true

require_relative "boot"
require "rails"
require "action_controller/railtie"
require "action_cable/engine"

# A Rails app with Action Cable on Redis, the adapter `rails new` gives production before Rails 8
# (config/cable.yml, REDIS_URL), for test/rails/action_cable_test.rb: its subscriptions and
# broadcasts across reforks.
module BlackbuckCableApp
  class Application < Rails::Application
    config.load_defaults Rails::VERSION::STRING.to_f
    config.root = File.expand_path("..", __dir__)
    config.eager_load = Rails.env.production?
    config.secret_key_base = "blackbuck-test-" * 8
    config.hosts.clear
    config.logger = ActiveSupport::Logger.new($stderr)
    config.log_level = :warn
    config.action_cable.mount_path = "/cable"
    config.action_cable.disable_request_forgery_protection = true # the test's client sends no Origin
  end
end
