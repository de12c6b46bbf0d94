# frozen_string_literal: true

# The first file a master re-executed by HUP loads (`ruby --disable-gems -r THIS exe/blackbuck`,
# Reexec.exec!), before RubyGems, Bundler (RUBYOPT) and the app: from here on, a signal that
# arrives while the new image boots is queued (EarlySignals), not fatal. RubyGems and what Ruby
# loads with it by default come next, as in any other start.
require_relative "early_signals"
Blackbuck::EarlySignals.install

unless defined?(Gem)
  require "rubygems"
  %w[error_highlight did_you_mean].each do |lib|
    require lib
  rescue LoadError
    nil
  end
end
