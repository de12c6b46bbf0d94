# frozen_string_literal: true

# Allocates enough per request to need GCs (8,000 strings: a GC every few requests on 3.1, 3.4
# and 4.0; a request that allocates more than the room a GC leaves, about 20% of the heap on 3.4,
# needs a GC inside it whatever runs between requests); answers how many GCs ran while it worked.
run lambda { |_env|
  before = GC.count
  Array.new(8_000) { |i| "s#{i}" }
  [200, {}, [(GC.count - before).to_s]]
}
