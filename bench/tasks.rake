# frozen_string_literal: true

# Loaded by the project's Rakefile. Both benchmark tasks tolerate absent servers (reported in
# the table). BENCH_ARGS passes flags through, e.g. BENCH_ARGS="--servers blackbuck,nginx";
# BENCH_ONLY=NAME runs a named subset (hello, iowait, mixed, rails, sinatra, big, memory, streams, yjit, peers).
desc "Full benchmark matrix (bench/README.md, < 45 min; BENCH_ONLY=mixed etc. for a subset); writes bench/results/latest.{json,md,png}"
task :bench do
  ENV["BLACKBUCK_BENCH_COMMAND"] ||= "bundle exec rake bench"
  ruby File.join(__dir__, "run.rb"), *ENV.fetch("BENCH_ARGS", "").split
end

namespace :bench do
  desc "Reduced benchmark for CI: every server and every workload once, 1 s each; writes tmp/bench-quick/"
  task quick: :test do
    ENV["BLACKBUCK_BENCH_COMMAND"] ||= "bundle exec rake bench:quick"
    # not bench/results/: the committed full run must not be replaced by a quick one
    out = File.expand_path("../tmp/bench-quick", __dir__)
    ruby File.join(__dir__, "run.rb"), "--quick", "--out", out, *ENV.fetch("BENCH_ARGS", "").split
  end

  desc "Unit tests of the harness (load-tool parsers, balance, plan and estimate, aggregation); no servers, no load"
  task :test do
    ruby File.join(__dir__, "test", "drivers_test.rb")
    ruby File.join(__dir__, "test", "memory_test.rb")
    ruby File.join(__dir__, "test", "memory_app_test.rb")
    ruby File.join(__dir__, "test", "plan_docs_test.rb")
    ruby File.join(__dir__, "test", "server_ruby_test.rb")
    ruby File.join(__dir__, "test", "streams_test.rb")
  end

  desc "Install what the benchmark needs (Debian packages, gems outside the bundle)"
  task :setup do
    sh File.join(__dir__, "setup")
  end
end
