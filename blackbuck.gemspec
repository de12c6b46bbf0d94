# frozen_string_literal: true

require_relative "lib/blackbuck/version"

Gem::Specification.new do |s|
  s.name        = "blackbuck"
  s.version     = Blackbuck::VERSION
  s.summary     = "A fast preforking Rack server with a C HTTP/1.1 engine, and a UNIX-socket-capable load generator"
  s.description = "Blackbuck serves Rack 2 and Rack 3 apps from preforked workers that each watch all their " \
                  "connections with epoll, so idle keep-alive or slow clients never tie a worker up."
  s.authors     = ["Blackbuck developers"]
  s.license     = "MIT" # the text: LICENSE
  # CI runs Ruby 3.4 (primary), 4.0 and 3.1 (test/matrix.rb); 3.2 and 3.3 build from the same source.
  s.required_ruby_version = ">= 3.1"
  s.metadata["tested_rubies"] = "3.4 4.0 3.1"
  # Sources only: nothing that `rake compile` or an extconf run generates (*.so, loadgen/build/,
  # loadgen/blackbuck-load, loadgen/gem.mk) matches these patterns.
  s.files       = Dir["lib/**/*.rb", "ext/**/*.{c,h,rb}", "loadgen/**/*.{c,h}", "loadgen/Makefile",
                      "loadgen/extconf.rb", "exe/*", "docs/*.md", "README.md", "LICENSE", "demo/*"]
  s.bindir      = "exe"
  s.executables = %w[blackbuck blackbuck-load]
  # The C engine, and blackbuck-load (a C program that exe/blackbuck-load runs; see loadgen/extconf.rb).
  s.extensions  = ["ext/blackbuck/extconf.rb", "loadgen/extconf.rb"]
  s.require_paths = ["lib"]
  s.add_dependency "rack", ">= 2.2", "< 4"
end
