# frozen_string_literal: true

# Run under gemfiles/rails7.gemfile or rails8.gemfile (BUNDLE_GEMFILE names it): Action Cable on Redis.
require "bundler/setup" if ENV["BUNDLE_GEMFILE"]
