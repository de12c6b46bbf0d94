# frozen_string_literal: true

require "json"

# Needs major GCs: each request mallocs 2 MB (20 strings of 100 kB, garbage at once), and malloc'd
# memory past Ruby's oldmalloc limit (16 MiB at first) calls for a major. Answers, as JSON, what the
# worker's GC did: whether Ruby may run major GCs by itself (GC.config, Ruby >= 3.4), the major
# count when this call began and when it ended, and how many majors ran inside the app's calls so
# far in this worker.
INSIDE = [0] # per worker: the master's copy is never written

run lambda { |_env|
  before = GC.stat(:major_gc_count)
  20.times { "x" * 100_000 }
  after = GC.stat(:major_gc_count)
  INSIDE[0] += after - before
  body = { "full_marks" => GC.respond_to?(:config) ? GC.config[:rgengc_allow_full_mark] : nil,
           "before" => before, "after" => after, "inside" => INSIDE[0], "pid" => Process.pid }
  [200, { "content-type" => "application/json" }, [JSON.generate(body)]]
}
