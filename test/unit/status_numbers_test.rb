# frozen_string_literal: true

require_relative "../test_helper"
require "blackbuck"
require "blackbuck/master/request_counts"
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

  # Issue 32: a p99 of 8.2 s for requests whose slowest took 5 s. Interpolating within a bucket
  # assumed requests up to its bound (10 s); a quantile is never reported above the largest request.
  def test_a_quantile_is_never_above_the_slowest_request
    board = Blackbuck::Native::Scoreboard.new(1)
    board.reset(0, Process.pid)
    98.times { board.request_observed(0, 0, 0.001) }
    2.times { board.request_observed(0, 0, 5.02) } # the 5-10 s bucket
    app = Blackbuck::RequestCounts::Hist.from_slot(board.histograms(0)[1])
    assert_in_delta 5.02, app.max, 1e-6
    assert_in_delta 5.02, app.quantile(0.99), 1e-6
    assert_operator app.quantile(0.5), :<=, 0.001
    board.request_observed(0, 0, 12.5) # past the last bound (10 s): the +Inf bucket
    assert_in_delta 12.5, Blackbuck::RequestCounts::Hist.from_slot(board.histograms(0)[1]).quantile(0.999), 1e-6,
                    "in the +Inf bucket, the slowest request (was the last bound, 10 s)"
  end

  def test_durations_below_a_millisecond_are_shown_to_the_microsecond
    ms = Blackbuck::StatusClient.method(:ms)
    assert_equal "0.035ms", ms.call(0.000035)
    assert_equal "0.999ms", ms.call(0.000999)
    assert_equal "1.0ms", ms.call(0.001)
    assert_equal "12.3ms", ms.call(0.01234)
  end
end
