# frozen_string_literal: true

# A gate the test opens: a file named NAME in $BB_GATE_DIR. An app holds a request in its code until
# then (GATE_LIMIT at most), so a test keeps a request in the app exactly as long as it needs to,
# without guessing a time. Used by gate.ru and handoff.ru.
module GateWait
  GATE_LIMIT = 30 # seconds a request waits for its gate at most (a test that never opens it)
  POLL = 0.01     # seconds between looks

  # Waits for gate name; true when it opened, false when GATE_LIMIT passed first. While it waits, a
  # file NAME.waiting.PID.N in the same directory says so (the test counts the requests held).
  def self.until_open(name)
    dir = ENV.fetch("BB_GATE_DIR")
    path = File.join(dir, name)
    waiting = File.join(dir, "#{name}.waiting.#{Process.pid}.#{Thread.current.object_id}")
    File.write(waiting, "")
    give_up = Process.clock_gettime(Process::CLOCK_MONOTONIC) + GATE_LIMIT
    sleep POLL until File.exist?(path) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > give_up
    File.exist?(path)
  ensure
    File.delete(waiting) if waiting && File.exist?(waiting)
  end

  # Test side: how many requests wait at gate name in dir.
  def self.waiting(dir, name) = Dir.glob(File.join(dir, "#{name}.waiting.*")).size
end
