# frozen_string_literal: true

module Blackbuck
  # The signals a master acts on, from the very start of a re-executed image (HUP) until its
  # Supervisor runs. The old image ignores them from just before the exec (Reexec.ignore_signals)
  # and names the ones it had queued but not acted on in PENDING_ENV; the new image loads this
  # before RubyGems, Bundler and the app (reexec_boot.rb) and queues every signal from then on, so
  # a HUP, USR1 (logrotate), TERM or INT that arrives while the new code boots is handled once the
  # Supervisor runs (#take), never fatal.
  module EarlySignals
    NAMES = %i[TERM INT QUIT HUP TTIN TTOU USR1].freeze # the master's (Supervisor::SIGNALS) but CHLD
    PENDING_ENV = "BLACKBUCK_PENDING_SIGNALS"           # "HUP,USR1": queued in the old image, not acted on

    @pending = []

    module_function

    # In the new image, first thing: queue every signal until the Supervisor takes them.
    def install(env = ENV)
      @pending.concat(env.delete(PENDING_ENV).to_s.split(",").map(&:to_sym) & NAMES)
      NAMES.each { |sig| trap(sig) { @pending << sig } }
    end

    # The signals queued so far, in order (each only once); the caller's traps take over.
    def take
      taken = @pending
      @pending = []
      taken
    end

    # What the old image hands over: its queue less CHLD, a HUP only once (one reload does).
    def encode(queue)
      names = queue.select { |s| NAMES.include?(s) }
      names = names.reject.with_index { |s, i| s == :HUP && names.index(:HUP) != i }
      names.join(",")
    end
  end
end
