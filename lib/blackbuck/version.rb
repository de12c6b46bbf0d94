# frozen_string_literal: true

module Blackbuck
  VERSION = "0.1.0"
end
