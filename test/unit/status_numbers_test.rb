# frozen_string_literal: true

require_relative "../test_helper"
require "blackbuck"
require "blackbuck/request_counts"
require "blackbuck/status_client"

# The durations `blackbuck status` and /status report for fast requests (issue 22, item 10): a
# hello-world request takes tens of microseconds, and a histogram whose first bucket was 1 ms made
# its p50 read 0.5ms and its p99 1.0ms whatever it really took.
class StatusNumbersTest < Minitest::Test
  def test_percentiles_of_35_microsecond_requests_are_tens_of_microseconds
    board = Blackbuck::Native::Scoreboard.new(1)
    board.reset(0, Process.pid)
    100.times { board.request_observed(0, 0.000012, 0.000035) }
    queue, duration, = board.histograms(0)
    app = Blackbuck::RequestCounts::Hist.from_slot(duration)
    assert_in_delta 0.0035, app.sum, 1e-9
    assert_operator app.quantile(0.5), :<=, 0.00005
    assert_operator app.quantile(0.99), :<=, 0.00005
    assert_operator Blackbuck::RequestCounts::Hist.from_slot(queue).quantile(0.99), :<=, 0.000025
  end

  def test_durations_below_a_millisecond_are_shown_to_the_microsecond
    ms = Blackbuck::StatusClient.method(:ms)
    assert_equal "0.035ms", ms.call(0.000035)
    assert_equal "0.999ms", ms.call(0.000999)
    assert_equal "1.0ms", ms.call(0.001)
    assert_equal "12.3ms", ms.call(0.01234)
  end
end
