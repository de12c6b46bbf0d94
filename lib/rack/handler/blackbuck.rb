# frozen_string_literal: true

require "rack"
require_relative "../../blackbuck/rack_handler"

# Rack 2 (Rack 3 moved handlers to the rackup gem: lib/rackup/handler/blackbuck.rb).
if defined?(Rack::Handler) && Rack::Handler.respond_to?(:register)
  module Rack
    module Handler
      Blackbuck = ::Blackbuck::RackHandler
      register :blackbuck, Blackbuck
    end
  end
end
