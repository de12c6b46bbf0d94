# frozen_string_literal: true

# C tests of the pure C files (parsers, hand-off, output queue) and the parser's benchmark; see test/c/Makefile.
namespace :c do
  desc "C tests under ASan/UBSan: the parser (scalar and SSE4.2), the PROXY parser, the connection hand-off, the output queue (make -C test/c test)"
  task :test do
    sh "make -C test/c test"
  end

  desc "Parser benchmark: ns/request for the scalar and SSE4.2 scanners (make -C test/c bench)"
  task :bench do
    sh "make -C test/c bench"
  end
end
