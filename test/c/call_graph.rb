# frozen_string_literal: true

# The call graph among the extension's files, read from its object files: which file defines each
# non-static symbol (nm --defined-only) and which files use it (nm -u). Prints the edges and fails
# when they form a cycle (docs/ARCHITECTURE.md draws the graph; no file may call back up into a file
# that calls it). Also checks the include graph of ext/blackbuck's bb_ files.
#
#   ruby test/c/call_graph.rb OBJ_DIR [SRC_DIR]    (rake c:graph finds OBJ_DIR after rake compile)
require "open3"

obj_dir = ARGV.fetch(0) { abort "usage: call_graph.rb OBJ_DIR [SRC_DIR]" }
src_dir = ARGV.fetch(1) { File.expand_path("../../ext/blackbuck", __dir__) }
# only the objects of today's sources (a build directory keeps those of removed files)
objects = Dir[File.join(obj_dir, "bb_*.o")].sort.select { |o| File.exist?(File.join(src_dir, File.basename(o, ".o") + ".c")) }
abort "no bb_*.o in #{obj_dir} (rake compile first)" if objects.empty?

def nm(*args)
  out, status = Open3.capture2("nm", *args)
  abort "nm #{args.join(' ')} failed" unless status.success?
  out.lines.map(&:split)
end

defined_in = {}
objects.each do |o|
  file = File.basename(o, ".o")
  # "ADDR TYPE NAME": T/D/B/R/C are a global function or datum (lower case would be file-local)
  nm("--defined-only", "-g", o).each { |_, type, name| defined_in[name] = file if name && type =~ /\A[TDBRC]\z/ }
end

calls = Hash.new { |h, k| h[k] = Hash.new { |hh, kk| hh[kk] = [] } }
objects.each do |o|
  user = File.basename(o, ".o")
  nm("-u", o).each do |_, name|
    target = defined_in[name]
    calls[user][target] << name if target && target != user
  end
end

# A cycle in graph (file -> [files]), as the list of files along it; nil when there is none.
def cycle(graph)
  state = Hash.new(:new)
  path = []
  visit = lambda do |n|
    state[n] = :open
    path.push(n)
    graph.fetch(n, []).each do |m|
      return path[path.index(m)..] + [m] if state[m] == :open
      if state[m] == :new && (found = visit.call(m))
        return found
      end
    end
    path.pop
    state[n] = :done
    nil
  end
  graph.each_key { |n| (found = visit.call(n)) && (return found) if state[n] == :new }
  nil
end

puts "calls (from -> to: symbols):"
calls.sort.each { |from, tos| tos.sort.each { |to, names| puts "  #{from} -> #{to}: #{names.sort.join(', ')}" } }

includes = {}
Dir[File.join(src_dir, "bb_*.[ch]")].sort.each do |f|
  includes[File.basename(f)] = File.read(f).scan(/^#include "(bb_\w+\.h)"/).flatten
end

failed = false
if (c = cycle(calls.transform_values(&:keys)))
  puts "CALL CYCLE: #{c.join(' -> ')}"
  failed = true
end
if (c = cycle(includes))
  puts "INCLUDE CYCLE: #{c.join(' -> ')}"
  failed = true
end
exit 1 if failed
puts "no call cycle among #{objects.size} object files, no include cycle among #{includes.size} sources"
