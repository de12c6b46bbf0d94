# frozen_string_literal: true

require_relative "boot"
require "rails"
require "action_controller/railtie"

# A small Rails app for Blackbuck's real-app tests (test/rails/rails_test.rb): the same code
# on Rails 6.1 and 7.2, run by `blackbuck` and by `rails server -u blackbuck`.
module BlackbuckRailsApp
  class Application < Rails::Application
    config.load_defaults Rails::VERSION::STRING.to_f
    config.root = File.expand_path("..", __dir__)
    config.eager_load = Rails.env.production?
    config.secret_key_base = "blackbuck-test-" * 8
    config.hosts.clear
    config.logger = ActiveSupport::Logger.new($stderr)
    config.log_level = :warn
    config.public_file_server.enabled = true
    config.consider_all_requests_local = false
    config.session_store :cookie_store, key: "_bb_session"
  end
end
