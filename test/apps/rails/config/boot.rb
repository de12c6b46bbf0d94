# frozen_string_literal: true

# The tests run this app under gemfiles/rails61.gemfile (Debian's Rails 6.1) or
# gemfiles/rails7.gemfile (Rails 7.2): BUNDLE_GEMFILE names it.
require "bundler/setup" if ENV["BUNDLE_GEMFILE"]
require "logger" # Rails 6.1 with concurrent-ruby >= 1.3.5 needs it loaded first
