# frozen_string_literal: true

# libFuzzer runs over the HTTP parser, chunked decoder and PROXY protocol parser; see fuzz/README.md.
desc "Fuzz the HTTP parser, chunked decoder and PROXY protocol parser for FUZZ_SECONDS (default 60), split between targets"
task :fuzz do
  seconds = Integer(ENV.fetch("FUZZ_SECONDS", "60"))
  sh "make -C fuzz run FUZZ_SECONDS=#{seconds}"
end

namespace :fuzz do
  desc "Short fuzz pass for CI (about 30 seconds in total, 10 per target)"
  task :quick do
    sh "make -C fuzz run FUZZ_SECONDS=30"
  end
end
