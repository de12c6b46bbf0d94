# frozen_string_literal: true

# Run under gemfiles/rails8.gemfile (BUNDLE_GEMFILE names it): Rails 8.1 with Solid Queue and SQLite.
require "bundler/setup" if ENV["BUNDLE_GEMFILE"]
