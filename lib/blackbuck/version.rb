# frozen_string_literal: true

module Blackbuck
  VERSION = "0.1.0"

  # The value of env["rack.version"]: Rack 2's Lint wants an Array (its Rack::VERSION, the
  # protocol version [1, 3]); Rack 3 no longer asks for it (3.1 has no Rack::VERSION at all,
  # 3.2 a String): its release's major and minor. Here, not in lib/blackbuck.rb, because the files
  # that build an env (the worker, the warm-up) are loaded by lib/blackbuck.rb: naming it there
  # would point them back at the file that loads them (test/unit/ruby_graph_test.rb).
  def self.rack_version
    require "rack"
    return Rack::VERSION if defined?(Rack::VERSION) && Rack::VERSION.is_a?(Array)

    Rack.release.split(".").first(2).map(&:to_i)
  end
end
