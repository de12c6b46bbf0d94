# frozen_string_literal: true

module Blackbuck
  # One line per event on stderr (or a file): "TIME blackbuck[PID] LEVEL message".
  # Tests and operators match on the message part; those lines are a contract.
  class Logger
    def initialize(io = $stderr, path: nil)
      @path = path
      @io = path ? File.open(path, "a") : io
      @io.sync = true
    end

    def info(msg) = write("INFO", msg)
    def warn(msg) = write("WARN", msg)
    def error(msg) = write("ERROR", msg)

    def exception(prefix, err)
      lines = ["#{prefix}: #{err.class}: #{err.message}"]
      lines.concat((err.backtrace || []).first(40).map { |l| "    #{l}" })
      write("ERROR", lines.join("\n"))
    end

    # USR1: reopen the log file after rotation.
    def reopen
      return unless @path

      old = @io
      @io = File.open(@path, "a")
      @io.sync = true
      old.close
    end

    private

    def write(level, msg)
      @io.write("#{Time.now.utc.strftime('%Y-%m-%dT%H:%M:%S.%LZ')} blackbuck[#{Process.pid}] #{level} #{msg}\n")
    rescue IOError, SystemCallError
      nil
    end
  end
end
