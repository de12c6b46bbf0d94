# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../browser/doc_snippets"
require_relative "../matrix"

# What README.md and docs/DEPLOY.md tell people to run, read as text (issue 32, item 12): every
# recipe for running in production sets the environment (without it the app runs in development),
# the Dockerfile can install a gem from git, every nginx site stamps X-Request-Start (what the queue
# time section asks for), and README's list of what `rake ci` runs names every task of the matrix.
# The browser suite runs the README and DEPLOY.md examples it can (test/browser/browser_test.rb).
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
end
