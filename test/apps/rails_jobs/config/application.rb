# frozen_string_literal: true

require_relative "boot"
require "rails"
require "active_record/railtie"
require "active_job/railtie"
require "action_controller/railtie"
require "solid_queue"

# A Rails 8 app whose jobs run on Solid Queue, as `rails new` makes it for Kamal
# (test/rails/solid_queue_test.rb): the web side enqueues, bin/jobs (run by Blackbuck's master
# for SOLID_QUEUE_IN_PUMA) performs. Two SQLite databases: the app's and the queue's.
module BlackbuckJobsApp
  class Application < Rails::Application
    config.load_defaults 8.0
    config.root = File.expand_path("..", __dir__)
    config.eager_load = false
    config.secret_key_base = "blackbuck-test-" * 8
    config.hosts.clear
    config.logger = ActiveSupport::Logger.new($stderr)
    config.log_level = :warn
    config.active_job.queue_adapter = :solid_queue
    config.solid_queue.connects_to = { database: { writing: :queue } }
  end
end
