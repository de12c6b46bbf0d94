# frozen_string_literal: true

# `gem install` builds blackbuck-load through this file (the gemspec's second `extensions`
# entry). RubyGems runs it here in loadgen/ with a siteconf that points `sitearchdir` at a
# scratch directory, then runs `make clean`, `make` and `make install DESTDIR=` here (3.4+
# also passes sitearchdir= to make, and runs `make clean` once more at the end), and moves
# whatever landed in that directory into the gem's extension directory (which is on the
# load path once the gem is activated; RubyGems also copies it into the gem's lib/).
#
# blackbuck-load is a standalone C program, not a Ruby extension, so there is no mkmf
# Makefile: loadgen/Makefile builds it exactly as `rake compile` does in a checkout. This
# only tells that Makefile's `install` target where to put the binary, in gem.mk.
require "rbconfig"

dest = File.expand_path(RbConfig::CONFIG["sitearchdir"])
# Make reads `$` as a variable and `#` as a comment, even in a value.
escaped = dest.gsub("$", "$$").gsub("#", "\\#")
File.write(File.join(__dir__, "gem.mk"), <<~MAKE)
  # Written by loadgen/extconf.rb for `make install` (see Makefile); not part of the source.
  sitearchdir = #{escaped}
MAKE
