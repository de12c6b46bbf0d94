# frozen_string_literal: true

require_relative "errors"

module Blackbuck
  # One entry per event on stderr (or a file): "TIME blackbuck[PID] LEVEL message".
  # Tests and operators match on the message part; those lines are a contract. An entry is one
  # write; the lines of a multi-line message after its first are indented, so every line that
  # does not start with a time belongs to the entry above it. DEBUG entries appear only with
  # --debug (or BLACKBUCK_DEBUG=1).
  class Logger
    CONTINUATION = "\n    "

    def initialize(io = $stderr, path: nil, debug: false)
      @path = path
      @io = path ? Logger.open(path) : io
      @io.sync = true
      @debug = debug
    end

    def debug? = @debug

    def debug(msg) = (write("DEBUG", msg) if @debug)
    def info(msg) = write("INFO", msg)
    def warn(msg) = write("WARN", msg)
    def error(msg) = write("ERROR", msg)

    def exception(prefix, err)
      lines = ["#{prefix}: #{err.class}: #{err.message}"]
      lines.concat((err.backtrace || []).first(40))
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

    # The log file at path, opened to append; a ConfigError naming the setting when it cannot be
    # (a missing directory, no permission): one line and exit 1, not a backtrace.
    def self.open(path)
      File.open(path, "a")
    rescue SystemCallError => e
      raise ConfigError, "log #{path}: cannot open: #{e.message.sub(/ @ .*/, '').sub(/ - #{Regexp.escape(path)}\z/, '')}"
    end

    # "1 worker", "2 workers": a count and its noun, for messages.
    def self.count(n, noun) = "#{n} #{noun}#{'s' unless n == 1}"

    # "first line\n    second line..." for a message of any number of lines (no trailing newline).
    def self.entry_text(msg) = msg.to_s.chomp.gsub(/\r?\n/, CONTINUATION)

    private

    def write(level, msg)
      @io.write("#{Time.now.utc.strftime('%Y-%m-%dT%H:%M:%S.%LZ')} blackbuck[#{Process.pid}] #{level} " \
                "#{Logger.entry_text(msg)}\n")
    rescue IOError, SystemCallError
      nil
    end
  end
end
