# frozen_string_literal: true

module Blackbuck
  # Why the master's workers exited while it served, counted by reason (GET /status "worker_exits",
  # GET /metrics blackbuck_worker_exits_total). A worker that stops of its own accord says why in its
  # scoreboard slot before it exits (Worker#begin_graceful_stop: one of SAID); the master reads that
  # once it has reaped the worker (#exited), beside what it knows itself: the exit status, the
  # request timeout's notice (RequestTimeouts#noticed?) and the workers TTOU retired (#retiring).
  # Every worker is replaced except those TTOU retires. Exits while the master stops are not counted.
  class WorkerExits
    # What a worker can say in its slot (Native::Scoreboard#set_exit_reason takes the index; 0:
    # nothing said, the slot's value after its reset).
    SAID = [nil, :recycle, :memory, :timeout, :retire, :unsafe].freeze
    # Every reason counted, in the order /status and /metrics list them:
    # - crash: killed by a signal or a non-zero exit status (an app that raised, an OOM kill, a worker
    #   that could not boot), except after a request timeout's notice;
    # - timeout: a request ran past --timeout (the worker retired after its 503, or was killed);
    # - recycle: max_requests_per_child; memory: max_memory_per_child;
    # - ttou: retired by TTOU (not replaced: the worker count went down);
    # - refork: retired by refork_after for a worker of the next generation, or forked the mold;
    # - unsafe: replaced after the app raised an exception that leaves the process untrusted
    #   (NoMemoryError, SystemExit, SignalException: Response::UNSAFE), answered 500 first;
    # - other: exited 0 without saying why (the master went away, an app that called exit).
    REASONS = %w[crash timeout recycle memory ttou refork unsafe other].freeze

    def initialize(scoreboard)
      @scoreboard = scoreboard
      @counts = REASONS.to_h { |r| [r, 0] }
      @ttou = {} # pid => true: told to retire by TTOU, until reaped
    end

    # Worker code: say why this worker stops (one of SAID), in its own slot.
    def self.say(scoreboard, index, reason)
      code = SAID.index(reason) or raise ArgumentError, "[BUG] unknown exit reason #{reason.inspect}"
      scoreboard.set_exit_reason(index, code)
    end

    # Master: TTOU told worker pid to retire.
    def retiring(pid)
      @ttou[pid] = true
    end

    # Master: child (Children::Child) has been reaped with status; timed_out: the request timeout
    # had noticed it. Returns the reason counted.
    def exited(child, status, timed_out: false)
      ttou = @ttou.delete(child.pid)
      reason = reason(child, status, timed_out, ttou)
      @counts[reason] += 1
      reason
    end

    # {reason => exits}, every reason of REASONS.
    def counts = @counts.dup

    private

    def reason(child, status, timed_out, ttou)
      said = said(child)
      return "timeout" if timed_out || said == :timeout
      return "crash" unless status.success?
      return "ttou" if ttou
      return "refork" if said == :retire

      said ? said.to_s : "other"
    end

    # What the worker said in its slot; nil when the slot is not its own (it died before taking it:
    # the predecessor's word is there).
    def said(child)
      @scoreboard.read(child.index).pid == child.pid ? SAID[@scoreboard.exit_reason(child.index)] : nil
    end
  end
end
