# frozen_string_literal: true

# The browser suite's template for `rails new -m` (Rails 8): the generator then runs every step it
# runs for a user (bundle, importmap, Turbo and Stimulus, Kamal, Solid Cache, Queue and Cable),
# with three differences that concern only where gems come from, none what is generated:
# - the app's Gemfile names blackbuck (this checkout), as README says;
# - `bundle install` and `bundle lock` are --local, from the suite's gem directory (no network);
#   its path goes into the app's .bundle/config, as `bundle config set --local path` writes it;
# - `rails new` runs in the suite's bundle (which has Rails 8.1.3); what it starts in the app
#   (bundle, bin/rails) runs in the app's own bundle instead.
# GeneratedApp passes the checkout and the gem directory in BLACKBUCK_ROOT and BLACKBUCK_APP_GEMS.
# `self` is the app generator (Thor's `apply` evaluates this file in it).

gem_dir = ENV.fetch("BLACKBUCK_APP_GEMS")
app_env = Bundler.unbundled_env.merge("BUNDLE_GEMFILE" => File.expand_path("Gemfile", destination_root))

create_file ".bundle/config", { "BUNDLE_PATH" => gem_dir }.to_yaml
gem "blackbuck", path: ENV.fetch("BLACKBUCK_ROOT")
ENV.replace(app_env) # bin/rails of rails_command inherits it

define_singleton_method(:bundle_command) do |command, env = {}, params = {}|
  local = command.sub(/\A(install|lock)\b/, '\1 --local')
  # with_original_env (in super) restores the suite's environment first: name the app's again
  super(local, app_env.merge("BUNDLE_PATH" => nil, **env), params) or raise "rails new: bundle #{local} failed"
end

# rails new carries on after a failed step; the suite wants to know at once.
define_singleton_method(:rails_command) do |command, options = {}|
  super(command, options.merge(abort_on_failure: true))
end
