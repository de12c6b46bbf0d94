# frozen_string_literal: true

# blackbuck-load (loadgen/): built by `rake compile`, tested by `rake loadgen:test`.
namespace :loadgen do
  loadgen_dir = File.expand_path(__dir__)

  desc "Build loadgen/blackbuck-load"
  task :build do
    sh "make", "-C", loadgen_dir
  end

  desc "blackbuck-load: C unit tests (ASan/UBSan) and integration tests"
  task test: :build do
    sh "make", "-C", loadgen_dir, "test"
    files = Dir[File.join(loadgen_dir, "test/integration/*_test.rb")].sort
    sh "ruby", "-I", File.join(loadgen_dir, "test/integration"),
       "-e", "ARGV.each { |f| require f }", *files
  end
end

Rake::Task[:compile].enhance(["loadgen:build"]) if Rake::Task.task_defined?(:compile)
