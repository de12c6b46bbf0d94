# frozen_string_literal: true

module Blackbuck
  # A bad option, directive, address or rackup file: the CLI prints the message and exits non-zero.
  class ConfigError < StandardError; end

  # Raised inside the app (from a signal trap) when a request runs past --timeout.
  class RequestTimeout < Exception # rubocop:disable Lint/InheritException -- must not be rescued by `rescue => e`
  end
end
