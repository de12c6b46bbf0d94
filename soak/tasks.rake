# frozen_string_literal: true

desc "Bounded soak under load: RSS and fds of each worker sampled (SOAK_SECONDS, default 120)"
task soak: :compile do
  ruby File.join(__dir__, "run.rb")
end
