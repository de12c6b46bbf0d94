# frozen_string_literal: true

# Required first (RUBYOPT=-r) by every peer in the Rails rows on Ruby 3.4 and 4.0: Blackbuck runs
# Rails 8.1 in gemfiles/rails8.gemfile's bundle, which pins Rack 3.1; outside a bundle RubyGems
# would activate the newest rack on the gem path (3.2, bench/setup's) as soon as the server
# requires it. The same Rack on both sides.
gem "rack", "~> 3.1.0"
