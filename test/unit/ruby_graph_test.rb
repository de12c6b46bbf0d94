# frozen_string_literal: true

require "minitest/autorun"
require "tmpdir"
require "fileutils"
require_relative "../support/ruby_graph"

# test/c/call_graph.rb's counterpart for lib/ (issue 33): the files of lib/ point at each other
# (require_relative, and the constants each names: test/support/ruby_graph.rb) without a cycle, and
# the master's files never at a worker's. A worker's file may point at the master's (worker.rb says
# why it exits through master/worker_exits.rb's WorkerExits.say): the master reads what the worker
# wrote, it never runs worker code.
#
# lib/blackbuck.rb (`require "blackbuck"`) loads every server file, so a file it loads that points
# back at it (`require_relative "../blackbuck"`, or a method defined there such as
# `Blackbuck.rack_version`, now in version.rb) makes a cycle, and one it does not load (a new
# command) would hide one until it is loaded. Only the commands that start a server load it:
# ENTRY_USERS.
class RubyGraphTest < Minitest::Test
  ROOT_DIR = File.expand_path("../..", __dir__)
  MASTER = "lib/blackbuck/master/"
  WORKER = "lib/blackbuck/worker/"
  ENTRY = "lib/blackbuck.rb"
  # `blackbuck` (CLI#run, once the options are read) and the rack handler: lib/blackbuck.rb loads neither.
  ENTRY_USERS = %w[lib/blackbuck/cli.rb lib/blackbuck/rack_handler.rb].freeze

  # Every Ruby file of lib/ under root, relative to it (the built extension, lib/blackbuck/X.Y.Z/, is not source).
  def self.lib_files(root) = Dir.glob("lib/**/*.rb", base: root).grep_v(%r{\Alib/blackbuck/\d+\.\d+\.\d+/}).sort

  # What the rules find wrong in a graph: one message per cycle and per forbidden arrow.
  def self.problems(graph)
    cycles = RubyGraph.cycles(graph).map { |c| "cycle: #{c.join(' -> ')}\n#{graph.describe(c)}" }
    down = RubyGraph.arrows_between(graph, MASTER, WORKER).map do |from, to|
      "a master file points at a worker file: #{from} -> #{to} (#{graph.why(from, to)})"
    end
    entry = graph.edges.select { |from, tos| tos.include?(ENTRY) && !ENTRY_USERS.include?(from) }.keys.sort.map do |from|
      "only #{ENTRY_USERS.join(' and ')} may point at #{ENTRY}: #{from} -> #{ENTRY} (#{graph.why(from, ENTRY)})"
    end
    cycles + down + entry
  end

  def lib_graph = RubyGraph.build(ROOT_DIR, self.class.lib_files(ROOT_DIR))

  def test_lib_has_no_cycle_no_master_to_worker_arrow_and_one_entry
    problems = self.class.problems(lib_graph)
    assert_empty problems, "lib/'s files (test/support/ruby_graph.rb reads the arrows):\n#{problems.join("\n\n")}"
  end

  # The rules above pass on an empty graph too: this one proves the graph is lib's, read whole
  # (arrows of files that rarely change, each kind: a require, a constant, a method of a namespace).
  def test_the_graph_has_the_arrows_a_reader_sees
    graph = lib_graph
    assert_equal self.class.lib_files(ROOT_DIR), graph.files
    assert_includes graph.files, "lib/blackbuck/worker/worker.rb"
    refute graph.files.any? { |f| f.match?(%r{\Alib/blackbuck/\d}) }, "the built extension's directory is not source"
    assert_equal "require", graph.why("lib/blackbuck/cli.rb", ENTRY)
    assert_equal "Blackbuck.rack_version, require", graph.why("lib/blackbuck/warmup.rb", "lib/blackbuck/version.rb")
    assert_includes graph.why("lib/blackbuck/worker/app_pool.rb", "lib/blackbuck/worker/response.rb"), "Response::DROP"
    assert_includes graph.why("lib/blackbuck/master/reload.rb", "lib/blackbuck/master/reexec.rb"), "Reexec.check"
    assert_includes graph.why("lib/blackbuck/master/status.rb", "lib/blackbuck/master/status_metrics.rb"), "StatusMetrics.text"
  end

  # The checker itself, on small trees written here: each rule fails when it should, and names why.

  def test_a_cycle_of_a_require_and_a_constant_is_found_and_printed
    graph = tree(
      "lib/blackbuck/a.rb" => <<~RUBY,
        require_relative "b"
        require_relative "c"
        module Blackbuck
          class A
            MAX = 3
            def b = B.new(C::LIMIT)
          end
        end
      RUBY
      "lib/blackbuck/b.rb" => <<~RUBY,
        module Blackbuck
          class B
            def initialize(limit)
              @limit = [limit, A::MAX].min
            end
          end
        end
      RUBY
      "lib/blackbuck/c.rb" => "module Blackbuck\n  module C\n    LIMIT = 1\n  end\nend\n"
    )
    assert_equal [["lib/blackbuck/a.rb", "lib/blackbuck/b.rb", "lib/blackbuck/a.rb"]], RubyGraph.cycles(graph)
    assert_equal [<<~TEXT.chomp], self.class.problems(graph)
      cycle: lib/blackbuck/a.rb -> lib/blackbuck/b.rb -> lib/blackbuck/a.rb
      lib/blackbuck/a.rb -> lib/blackbuck/b.rb (B.new, require)
      lib/blackbuck/b.rb -> lib/blackbuck/a.rb (A::MAX)
    TEXT
  end

  def test_a_cycle_through_three_files_is_found_once
    graph = tree("lib/x.rb" => "require_relative 'y'\nmodule X\n  def self.run = 1\nend\n",
                 "lib/y.rb" => "require_relative('z')\n",
                 "lib/z.rb" => "module Top\n  def self.go = X.run\nend\n",
                 "lib/w.rb" => "module W\n  X = 1\nend\n") # W::X: Top's X is ::X, lexically
    assert_equal [%w[lib/x.rb lib/y.rb lib/z.rb lib/x.rb]], RubyGraph.cycles(graph)
    assert_equal "X.run", graph.why("lib/z.rb", "lib/x.rb")
  end

  def test_a_master_file_naming_a_worker_constant_is_refused_and_the_other_way_is_allowed
    graph = tree(
      "lib/blackbuck/master/boss.rb" => <<~RUBY,
        module Blackbuck
          class Boss
            def stop(pipe) = pipe.write(Worker::STOP)
          end
        end
      RUBY
      "lib/blackbuck/master/exits.rb" => "module Blackbuck\n  module Exits\n    def self.say(why) = why\n  end\nend\n",
      "lib/blackbuck/worker/worker.rb" => <<~RUBY
        require_relative "../master/exits"
        module Blackbuck
          class Worker
            STOP = "q"
            def stop = Exits.say(:stop)
          end
        end
      RUBY
    )
    assert_equal ["a master file points at a worker file: lib/blackbuck/master/boss.rb -> " \
                  "lib/blackbuck/worker/worker.rb (Worker::STOP)"], self.class.problems(graph)
  end

  def test_only_the_commands_may_load_the_entry_file
    graph = tree(
      "lib/blackbuck.rb" => "require_relative 'blackbuck/server'\n",
      "lib/blackbuck/server.rb" => "module Blackbuck\n  module Server\n    def self.run = 1\n  end\nend\n",
      "lib/blackbuck/cli.rb" => "module Blackbuck\n  class CLI\n    def run\n      require_relative '../blackbuck'\n    end\n  end\nend\n",
      "lib/blackbuck/status.rb" => "require 'blackbuck'\n"
    )
    assert_equal ["only lib/blackbuck/cli.rb and lib/blackbuck/rack_handler.rb may point at lib/blackbuck.rb: " \
                  "lib/blackbuck/status.rb -> lib/blackbuck.rb (require)"], self.class.problems(graph)
    graph = tree("lib/blackbuck.rb" => "require_relative 'blackbuck/server'\n",
                 "lib/blackbuck/server.rb" => "require_relative '../blackbuck'\n")
    assert_equal 2, self.class.problems(graph).size, "a cycle, and a file that is no command pointing at lib/blackbuck.rb"
  end

  def test_comments_strings_native_and_namespaces_we_only_open_point_at_nothing
    graph = tree(
      "lib/blackbuck/worker/worker.rb" => "module Blackbuck\n  class Worker\n    STOP = 1\n  end\nend\n",
      "lib/rack/handler/blackbuck.rb" => <<~RUBY,
        module Rack
          module Handler
            module Blackbuck
              def self.run(app) = app
            end
            register :blackbuck, Blackbuck
          end
        end
      RUBY
      "lib/blackbuck/master/quiet.rb" => <<~RUBY
        module Blackbuck
          # Worker::STOP is the byte a worker reads (a comment)
          class Quiet
            NOTE = "Worker::STOP, \#{1 + 1}"
            TEXT = <<~T
              Worker::STOP
            T
            def body = [Native::Conn::BODY, Rack::Utils::HTTP_STATUS_CODES, :Worker, NOTE, TEXT]
          end
        end
      RUBY
    )
    assert_equal({}, graph.arrows.fetch("lib/blackbuck/master/quiet.rb"))
    assert_empty self.class.problems(graph)
  end

  def test_a_method_of_a_namespace_points_at_the_file_that_defines_it
    graph = tree(
      "lib/blackbuck/version.rb" => "module Blackbuck\n  VERSION = '1'\n  def self.rack_version = [1, 3]\nend\n",
      "lib/blackbuck/mold.rb" => "module Blackbuck\n  def self.fork_unsafe_reason = nil\nend\n",
      "lib/blackbuck/user.rb" => <<~RUBY
        module Blackbuck
          class User
            def env = [Blackbuck.rack_version, ::Blackbuck.fork_unsafe_reason, Blackbuck.other, VERSION]
          end
        end
      RUBY
    )
    assert_equal({ "lib/blackbuck/version.rb" => ["Blackbuck.rack_version", "VERSION"],
                   "lib/blackbuck/mold.rb" => ["::Blackbuck.fork_unsafe_reason"] },
                 graph.arrows.fetch("lib/blackbuck/user.rb"))
  end

  private

  # The Graph of files (path => source) written under a fresh directory.
  def tree(files)
    Dir.mktmpdir("bb-graph") do |root|
      files.each do |path, text|
        FileUtils.mkdir_p(File.dirname(File.join(root, path)))
        File.write(File.join(root, path), text)
      end
      RubyGraph.build(root, self.class.lib_files(root))
    end
  end
end
