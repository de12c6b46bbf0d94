# frozen_string_literal: true

# Allocates enough per request to need GCs; answers how many GCs ran while it worked.
run lambda { |_env|
  before = GC.count
  Array.new(20_000) { |i| "s#{i}" }
  [200, {}, [(GC.count - before).to_s]]
}
