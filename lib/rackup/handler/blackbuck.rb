# frozen_string_literal: true

require "rackup/handler"
require_relative "../../blackbuck/rack_handler"

module Rackup
  module Handler
    Blackbuck = ::Blackbuck::RackHandler
    register :blackbuck, Blackbuck
  end
end
