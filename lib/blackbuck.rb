# frozen_string_literal: true

require "rbconfig"
require_relative "blackbuck/version"
require_relative "blackbuck/errors"

begin
  # A checkout keeps one build per Ruby ABI (`rake compile` on each Ruby of the matrix: 3.1, 3.4,
  # 4.0), so switching Rubies never loads another Ruby's build; an installed gem has the one its
  # `gem install` built, in blackbuck/.
  abi_build = File.join(__dir__, "blackbuck", RbConfig::CONFIG["ruby_version"], "blackbuck_ext.#{RbConfig::CONFIG['DLEXT']}")
  require(File.exist?(abi_build) ? abi_build : File.join(__dir__, "blackbuck", "blackbuck_ext"))
rescue LoadError => e
  # A checkout (Bundler's `path:`, or running from the tree) is never built for you; an installed
  # gem (`gem install`, Bundler's `git:`) was built at install time, so its build failed or was removed.
  root = File.expand_path("..", __dir__)
  state = Dir[File.join(__dir__, "blackbuck", "{,#{RbConfig::CONFIG['ruby_version']}/}blackbuck_ext.*")].empty? ? "is not built" : "cannot be loaded"
  needs = "a C compiler, make and Ruby's headers"
  raise LoadError, if File.exist?(File.join(root, "Rakefile"))
                     "the C extension #{state} in the checkout #{root}: run bin/setup there (or `bundle install " \
                       "&& bundle exec rake compile` in it; needs #{needs}) (#{e.message})"
                   else
                     "the C extension of the blackbuck gem in #{root} #{state}: reinstall the gem (needs #{needs}) " \
                       "(#{e.message})"
                   end
end

require_relative "blackbuck/scoreboard"
require_relative "blackbuck/logger"
require_relative "blackbuck/config"
require_relative "blackbuck/listeners"
require_relative "blackbuck/master/reexec"
require_relative "blackbuck/rebind"
require_relative "blackbuck/master/supervisor"
require_relative "blackbuck/server"
