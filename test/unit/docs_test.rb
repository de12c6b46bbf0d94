# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../browser/doc_snippets"
require_relative "../matrix"

# What README.md and docs/DEPLOY.md tell people to run, read as text (issue 32, item 12): every
# recipe for running in production sets the environment (without it the app runs in development),
# the Dockerfile can install a gem from git, every nginx site stamps X-Request-Start (what the queue
# time section asks for), and README's list of what `rake ci` runs names every task of the matrix.
# The browser suite runs the README and DEPLOY.md examples it can (test/browser/browser_test.rb).
# And docs/ARCHITECTURE.md's file table names every source file of lib/ and ext/, and no other
# (issue 33, step 8).
class DocsTest < Minitest::Test
  DOCS = DocSnippets.new(ROOT)
  PRODUCTION = /RACK_ENV[=:,]\s*(value:\s*)?"?(\$\{RACK_ENV:-)?production.*RAILS_ENV[=:,]\s*(value:\s*)?"?(\$\{RAILS_ENV:-)?production/m

  def test_every_systemd_unit_that_starts_blackbuck_sets_the_environment
    units = DOCS.blocks_in("docs/DEPLOY.md", lang: "ini").select { |b| b.text.include?("ExecStart=") }
    assert_operator units.size, :>=, 2
    units.each do |unit|
      assert_match(/^Environment=RACK_ENV=production RAILS_ENV=production$/, unit.text, "#{unit.section}:\n#{unit.text}")
    end
  end

  def test_the_dockerfile_sets_the_environment_and_installs_git
    docker = DOCS.blocks_in("docs/DEPLOY.md", lang: "dockerfile")
    refute_empty docker
    docker.each do |file|
      assert_match(/^ENV RACK_ENV=production RAILS_ENV=production$/, file.text)
      assert_match(/^RUN apt-get update && apt-get install .*\bgit\b/, file.text, "gem \"blackbuck\", git: needs git")
    end
  end

  def test_the_procfile_and_kubernetes_set_the_environment
    procfile = DOCS.blocks_in("docs/DEPLOY.md", lang: "procfile")
    refute_empty procfile
    procfile.each { |b| assert_match(PRODUCTION, b.text) }
    pods = DOCS.blocks_in("docs/DEPLOY.md", lang: "yaml").select { |b| b.text.include?('"blackbuck"') }
    refute_empty pods
    pods.each { |b| assert_match(/- \{ name: RACK_ENV, value: production \}\n\s*- \{ name: RAILS_ENV, value: production \}/, b.text) }
  end

  def test_every_nginx_site_stamps_x_request_start
    sites = DOCS.blocks_in("docs/DEPLOY.md", lang: "nginx").select { |b| b.text.include?("proxy_pass") }
    assert_operator sites.size, :>=, 2
    sites.each { |site| assert_match(/proxy_set_header X-Request-Start "t=\$\{msec\}";/, site.text, site.section) }
  end

  def test_readme_names_every_task_rake_ci_runs
    tests = File.read(File.join(ROOT, "README.md"))[/^## Tests\n(.*?)(?=^## |\z)/m, 1]
    TestMatrix::LANES.flat_map(&:tasks).uniq.each do |task|
      assert_includes tests, "`rake #{task}`", "README's Tests section names #{task} (test/matrix.rb runs it)"
    end
  end

  def test_the_architecture_table_names_every_source_file_and_no_other
    listed = architecture_table_files
    missing = source_files - listed
    gone = listed - source_files
    assert_empty missing, "docs/ARCHITECTURE.md's file table has no row for these (add one, with its job)"
    assert_empty gone, "docs/ARCHITECTURE.md's file table names files that do not exist"
  end

  private

  # lib/ recursively (*.rb: the built extension under lib/blackbuck/X.Y.Z/ is not source) and the
  # extension's sources, relative to the root.
  def source_files
    Dir.glob(["lib/**/*.rb", "ext/blackbuck/*.{c,h}", "ext/blackbuck/extconf.rb"], base: ROOT).sort
  end

  # The files the first column of the table names: `dir/a.rb` a path, `b.rb` after it in the same
  # row a file of the same directory, `dir/x.[ch]` both x.c and x.h.
  def architecture_table_files
    doc = File.read(File.join(ROOT, "docs/ARCHITECTURE.md"))
    table = doc[/^\| file \| job \|\n\| --- \| --- \|\n((?:\|.*\n)+)/, 1] or flunk "docs/ARCHITECTURE.md: no | file | job | table"
    table.lines.flat_map do |row|
      dir = nil
      row.split(" | ", 2).first.scan(/`([^`]+)`/).flatten.flat_map do |name|
        dir = File.dirname(name) if name.include?("/")
        path = name.include?("/") ? name : File.join(dir || flunk("#{row}: #{name} has no directory before it"), name)
        path.end_with?(".[ch]") ? [path.sub(/\[ch\]\z/, "c"), path.sub(/\[ch\]\z/, "h")] : [path]
      end
    end.sort.uniq
  end
end
