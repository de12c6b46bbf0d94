# frozen_string_literal: true

require "rack"
require_relative "../../blackbuck/rack_handler"

# Rack 2 (Rack 3 moved handlers to the rackup gem: lib/rackup/handler/blackbuck.rb).
if defined?(Rack::Handler) && Rack::Handler.respond_to?(:register)
  module Rack
    module Handler
      # `rackup -s blackbuck` on Rack 2.2. Rack::Handler.get looks the registered name up.
      module Blackbuck
        def self.run(app, options = {}, **kw, &block) = ::Blackbuck::RackHandler.run(app, **options, **kw, &block)
        def self.valid_options = ::Blackbuck::RackHandler.valid_options
      end
      register :blackbuck, Blackbuck
    end
  end
end
