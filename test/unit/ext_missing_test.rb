# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

# Requiring blackbuck where its C extension is not built (a checkout used through Bundler's
# `path:`, which never builds it) says where and what to run, in one line (issue 22, item 6).
class ExtMissingTest < Minitest::Test
  # What `require "blackbuck"` from tree/lib prints (Ruby's report of the LoadError).
  def load_error(tree)
    clean = { "RUBYOPT" => nil, "RUBYLIB" => nil } # no Bundler: it would load this checkout's version.rb first
    _out, err, status = Open3.capture3(clean, RbConfig.ruby, "-I#{tree}/lib", "-e", 'require "blackbuck"')
    refute status.success?
    err
  end

  # A copy of lib/ without the built extension; checkout: with the Rakefile beside it.
  def tree(checkout:)
    dir = Dir.mktmpdir("bb-ext")
    FileUtils.cp_r(File.join(ROOT, "lib"), dir)
    Dir[File.join(dir, "lib/blackbuck/{,*/}blackbuck_ext.*")].each { |f| File.unlink(f) }
    FileUtils.touch(File.join(dir, "Rakefile")) if checkout
    dir
  end

  def test_a_checkout_names_itself_and_bin_setup
    dir = tree(checkout: true)
    err = load_error(dir)
    assert_match(/the C extension is not built in the checkout #{Regexp.escape(dir)}: run bin\/setup there \(or `bundle install && bundle exec rake compile` in it; needs a C compiler, make and Ruby's headers\)/,
                 err)
  ensure
    FileUtils.rm_rf(dir)
  end

  def test_an_installed_gem_says_reinstall
    dir = tree(checkout: false)
    assert_match(/the C extension of the blackbuck gem in #{Regexp.escape(dir)} is not built: reinstall the gem/,
                 load_error(dir))
  ensure
    FileUtils.rm_rf(dir)
  end
end
