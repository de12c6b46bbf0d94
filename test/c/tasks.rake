# frozen_string_literal: true

# C tests of the pure C files (parsers, hand-off, output queue), the call graph of the extension's files,
# and the parser's benchmark; see test/c/Makefile.
namespace :c do
  # Where rake compile left the extension's object files (the newest build), or nil.
  extension_objects = lambda do
    ext = Dir[File.expand_path("../../tmp/*/blackbuck_ext/*/bb_ext.o", __dir__)].max_by { |f| File.mtime(f) }
    ext && File.dirname(ext)
  end

  desc "C tests under ASan/UBSan: the parser (scalar and SSE4.2), the PROXY parser, the connection hand-off, the output queue (make -C test/c test); then c:graph"
  task :test do
    sh "make -C test/c test"
    next puts("c:graph: skipped, no compiled extension under tmp/ (rake compile)") unless extension_objects.call

    Rake::Task["c:graph"].invoke
  end

  desc "No call or include cycle among ext/blackbuck's files, read from the objects of the last rake compile (nm; test/c/call_graph.rb)"
  task :graph do
    objects = extension_objects.call or abort "c:graph: no compiled extension under tmp/ (rake compile first)"
    sh RbConfig.ruby, File.expand_path("call_graph.rb", __dir__), objects
  end

  desc "Parser benchmark: ns/request for the scalar and SSE4.2 scanners (make -C test/c bench)"
  task :bench do
    sh "make -C test/c bench"
  end
end
