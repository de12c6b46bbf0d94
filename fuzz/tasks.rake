# frozen_string_literal: true

# libFuzzer runs over the HTTP parser and chunked decoder; see fuzz/README.md.
desc "Fuzz the HTTP parser and chunked decoder for FUZZ_SECONDS (default 60), split between targets"
task :fuzz do
  seconds = Integer(ENV.fetch("FUZZ_SECONDS", "60"))
  sh "make -C fuzz run FUZZ_SECONDS=#{seconds}"
end

namespace :fuzz do
  desc "Short fuzz pass for CI (about 20 seconds in total)"
  task :quick do
    sh "make -C fuzz run FUZZ_SECONDS=20"
  end
end
