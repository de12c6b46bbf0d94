# frozen_string_literal: true

# Required first (RUBYOPT=-r) by every peer in the Rails rows: Debian's Rails 6.1 needs Rack
# 2.2 (actionpack: rack ~> 2.0), but outside a bundle RubyGems would activate the newest rack,
# the bundle's 3.2, as soon as the server requires it, and Rails would then fail to load with a
# Gem::ConflictError. Blackbuck gets the same Rack from its bundle (gemfiles/rails61.gemfile).
gem "rack", "~> 2.2"
