# frozen_string_literal: true
# Sinatra hello, from Debian's ruby-sinatra (3.0.x).
#
# Debian's sinatra gemspec pins rack ~> 2.2, but every server here runs the project's Rack 3
# (Gem activation of sinatra would raise Gem::ConflictError, and blackbuck runs inside the
# bundle, which does not list sinatra). So its lib directories are put on $LOAD_PATH directly,
# and the two things Rack 3 moved out are supplied: rack-session (a gem, installed by bench/setup)
# and the Rack::File alias (removed in Rack 3.1; Sinatra 3.0 still names it). Every server loads
# exactly this file, so the app is the same for all of them.
DEBIAN_GEMS = "/usr/share/rubygems-integration/all/gems"
%w[sinatra rack-protection mustermann tilt ruby2_keywords].each do |name|
  dir = Dir["#{DEBIAN_GEMS}/#{name}-*/lib"].max
  $LOAD_PATH.unshift(dir) if dir && !$LOAD_PATH.include?(dir)
end

require "rack"
if Rack.release >= "3"
  session_dir = Gem.path.flat_map { |p| Dir["#{p}/gems/rack-session-*/lib"] }.max
  $LOAD_PATH.unshift(session_dir) if session_dir && !$LOAD_PATH.include?(session_dir)
  require "rack/files"
  Rack::File = Rack::Files unless Rack.const_defined?(:File, false)
end
require "sinatra/base"

class BenchHello < Sinatra::Base
  set :logging, false
  set :show_exceptions, false
  get("/") { "hello world\n" }
end

require_relative "lib/bench_stats"
BenchStats.wrap(self)
run BenchHello
