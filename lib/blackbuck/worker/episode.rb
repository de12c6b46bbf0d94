# frozen_string_literal: true

module Blackbuck
  # A trouble that lasts and is retried while it lasts (accept failing with EMFILE, moved connections
  # refused for want of descriptors): one log line when it begins and one when it is over, with how
  # many times it happened in between, never a line per retry (issue 21: 237 identical lines in 15 s).
  class Episode
    def initialize(logger)
      @logger = logger
      @count = 0 # times it happened in the current episode; 0: none is going on
      @since = nil
    end

    def on? = @count.positive?

    # It happened (again). The first time of an episode logs the block's message as a warning.
    def hit
      @count += 1
      return unless @count == 1

      @since = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @logger.warn(yield)
    end

    # It is over: logs the block's message, given how many times it happened and for how many seconds.
    def over
      return unless on?

      count = @count
      @count = 0
      @logger.info(yield(count, (Process.clock_gettime(Process::CLOCK_MONOTONIC) - @since).round(1)))
    end
  end
end
