# frozen_string_literal: true

# A gate the test opens: a file named NAME in $BB_GATE_DIR. An app holds a request in its code until
# then (GATE_LIMIT at most), so a test keeps a request in the app exactly as long as it needs to,
# without guessing a time. Used by gate.ru and handoff.ru.
module GateWait
  GATE_LIMIT = 30 # seconds a request waits for its gate at most (a test that never opens it)
  POLL = 0.01     # seconds between looks

  # Waits for gate name; true when it opened, false when GATE_LIMIT passed first.
  def self.until_open(name)
    path = File.join(ENV.fetch("BB_GATE_DIR"), name)
    give_up = Process.clock_gettime(Process::CLOCK_MONOTONIC) + GATE_LIMIT
    sleep POLL until File.exist?(path) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > give_up
    File.exist?(path)
  end
end
