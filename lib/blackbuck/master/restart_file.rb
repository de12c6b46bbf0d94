# frozen_string_literal: true

module Blackbuck
  # The restart_file setting: `bin/rails restart` (or any `touch`) on the app's tmp/restart.txt
  # asks for what HUP does, as Puma's tmp_restart plugin. The master looks at the file's mtime from
  # its loop's idle branch, at most every CHECK_INTERVAL: no thread, nothing in a trap. A file that
  # appears counts as a change (unlike Puma, the server never writes into the app's directory).
  # Across the re-exec the mtime that asked for it goes along (BASELINE_ENV), so a touch while the
  # new code boots restarts once more instead of being lost.
  class RestartFile
    CHECK_INTERVAL = 1.0 # seconds between two looks at the file's mtime (Puma's plugin: 2)
    BASELINE_ENV = "BLACKBUCK_RESTART_MTIME" # "sec.nsec" of the mtime the new image starts from ("-": no file)

    attr_reader :path

    def initialize(path, env: ENV)
      @path = path
      kept = env.delete(BASELINE_ENV)
      @baseline = kept ? (kept == "-" ? nil : kept) : mtime
      @next_check = now + CHECK_INTERVAL
    end

    # True once per change of the file's mtime (looked at every CHECK_INTERVAL at most).
    def touched?
      return false if now < @next_check

      @next_check = now + CHECK_INTERVAL
      current = mtime
      return false if current.nil? || current == @baseline # gone: no restart (as Puma)

      @baseline = current
      true
    end

    def env_for_exec = { BASELINE_ENV => @baseline || "-" }

    private

    def mtime
      t = File.stat(@path).mtime
      "#{t.tv_sec}.#{format('%09d', t.tv_nsec)}"
    rescue SystemCallError
      nil
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
