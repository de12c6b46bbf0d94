# frozen_string_literal: true

# C tests and benchmark of the HTTP parser (ext/blackbuck/bb_http.c); see test/c/Makefile.
namespace :c do
  desc "C tests under ASan/UBSan: the parser (scalar and SSE4.2), the PROXY parser, the connection hand-off (make -C test/c test)"
  task :test do
    sh "make -C test/c test"
  end

  desc "Parser benchmark: ns/request for the scalar and SSE4.2 scanners (make -C test/c bench)"
  task :bench do
    sh "make -C test/c bench"
  end
end
