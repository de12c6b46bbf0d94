# frozen_string_literal: true

require "rackup/handler"
require_relative "../../blackbuck/rack_handler"

module Rackup
  module Handler
    # `rackup -s blackbuck` on Rack 3 (the rackup gem).
    module Blackbuck
      def self.run(app, **options, &block) = ::Blackbuck::RackHandler.run(app, **options, &block)
      def self.valid_options = ::Blackbuck::RackHandler.valid_options
    end
    register :blackbuck, Blackbuck
  end
end
