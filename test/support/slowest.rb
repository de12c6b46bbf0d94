# frozen_string_literal: true

# After each test run, the slowest tests with their times (SLOWEST_TESTS of them, 5 by default; 0:
# none), so that a CI log says where a suite's minutes go without a second, verbose run.
module SlowestTests
  COUNT = Integer(ENV.fetch("SLOWEST_TESTS", "5"), 10)

  class Reporter < Minitest::AbstractReporter
    def initialize(io, count)
      super()
      @io = io
      @count = count
      @times = []
    end

    def record(result) = @times << [result.time, "#{result.klass}##{result.name}"]

    def report
      return if @times.size < 2

      @io.puts "slowest tests:"
      @times.max_by(@count, &:first).each { |time, name| @io.puts format("  %7.2f s  %s", time, name) }
    end
  end

  # Minitest loads its plugins only while its list of extensions is empty: this one is added after.
  module Plugin
    def load_plugins
      super
      extensions << "slowest_tests" unless extensions.include?("slowest_tests")
    end

    def plugin_slowest_tests_init(options)
      reporter << Reporter.new(options[:io], COUNT) if COUNT.positive?
    end
  end
  Minitest.singleton_class.prepend(Plugin)
end
