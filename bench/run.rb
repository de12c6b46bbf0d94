#!/usr/bin/env ruby
# frozen_string_literal: true

# Blackbuck benchmark harness: every server with the same app and worker count, over TCP and a
# UNIX socket, keep-alive and connection-per-request, measured interleaved and repeated.
# Writes bench/results/latest.{json,md,png}. Method: bench/README.md. Usage: ruby bench/run.rb --help
require_relative "lib/blackbuck_bench/runner"
require "shellwords"

command = ENV["BLACKBUCK_BENCH_COMMAND"] || Shellwords.join(["ruby", "bench/run.rb", *ARGV])
begin
  opts = BlackbuckBench.parse_options(ARGV.dup)
  # the servers' Ruby, chosen before anything asks whether a server is installed (its gem directory)
  BlackbuckBench::ServerRuby.current = BlackbuckBench::ServerRuby.resolve(opts[:ruby])
rescue OptionParser::ParseError, ArgumentError => e
  warn "bench: #{e.message}"
  exit 2
end
if opts[:plan] # the plan and its estimate, as a run prints them first; nothing is started
  puts BlackbuckBench::Plan.describe(BlackbuckBench::Plan.build(opts), opts)
  exit 0
end
report = BlackbuckBench::Runner.new(opts, command: command).run
measured = report.rows.count { |r| %w[ok partial].include?(r["status"]) }
warn "bench: #{measured}/#{report.rows.size} cells measured"
# A missing peer never fails the run; a run that measured nothing at all does. In --quick (CI)
# an installed server that failed a cell fails the run too: that is a broken recipe or workload.
broken = report.rows.select { |r| %w[failed partial].include?(r["status"]) }
broken.each { |r| warn "bench: FAILED #{r['server']} #{r['app']} #{r['transport']} #{r['mode']}: #{r['reason']}" }
exit 1 if measured.zero? || (opts[:quick] && broken.any?)
