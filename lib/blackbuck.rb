# frozen_string_literal: true

require_relative "blackbuck/version"
require_relative "blackbuck/errors"

begin
  require_relative "blackbuck/blackbuck_ext"
rescue LoadError => e
  raise LoadError, "the C extension is not built (#{e.message}); run `bundle exec rake compile`"
end

require_relative "blackbuck/scoreboard"
require_relative "blackbuck/logger"
require_relative "blackbuck/config"
require_relative "blackbuck/listeners"
require_relative "blackbuck/reexec"
require_relative "blackbuck/rebind"
require_relative "blackbuck/supervisor"
require_relative "blackbuck/server"

module Blackbuck
  # The value of env["rack.version"]: Rack 2's Lint wants an Array (its Rack::VERSION, the
  # protocol version [1, 3]); Rack 3 no longer asks for it (3.1 has no Rack::VERSION at all,
  # 3.2 a String): its release's major and minor.
  def self.rack_version
    require "rack"
    return Rack::VERSION if defined?(Rack::VERSION) && Rack::VERSION.is_a?(Array)

    Rack.release.split(".").first(2).map(&:to_i)
  end
end
