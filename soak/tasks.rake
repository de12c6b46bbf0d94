# frozen_string_literal: true

desc "Bounded soak under load: RSS and fds of each worker sampled (SOAK_SECONDS, default 120)"
task soak: :compile do
  ruby File.join(__dir__, "run.rb")
end

namespace :soak do
  desc "Fault soak (not in CI): never-retrying clients under mixed load, reforking, a HUP every 2 min and a worker " \
       "SIGKILLed every minute; fails when a request is lost that was not on a SIGKILLed worker (SOAK_SECONDS per mode, " \
       "default 600; SOAK_MODES 1,4; SOAK_HUP_EVERY, SOAK_KILL_EVERY)"
  task faults: :compile do
    ruby File.join(__dir__, "faults.rb")
  end
end
