# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../../lib/blackbuck/memory"

# oob_major_gc (issue 34), through the real `blackbuck` and this Ruby's GC: test/apps/major_gc.ru
# allocates enough to need major GCs and says, from inside the worker, what its GC did. With
# --oob-major-gc the worker's Ruby runs no major inside a request, yet majors run (between
# requests); without it, Ruby's own majors run inside requests, as ever. And with reforking, the
# mold keeps Ruby's own majors.
class OobMajorGCTest < ServerTest
  REQUESTS = 120 # 240 MB malloc'd in all: several majors' worth (3 or 4 seen on 3.4 and 4.0)

  def setup
    skip "GC.config(rgengc_allow_full_mark:) is Ruby >= 3.4's; this is Ruby #{RUBY_VERSION}" unless Blackbuck::Memory.major_gc_control?
  end

  # One keep-alive client, a request at a time with a pause between (the worker's idle moment).
  def gc_reports(args)
    server = start_server(["-l", "127.0.0.1:0", *args], app: "major_gc.ru")
    io = server.tcp
    Array.new(REQUESTS) do
      res = request(io, "GET", "/")
      assert_equal 200, res.status
      sleep 0.005
      JSON.parse(res.body)
    end
  ensure
    io&.close
  end

  def test_with_oob_major_gc_majors_run_between_requests_and_never_inside_one
    reports = gc_reports(["--oob-major-gc"])
    assert_equal [false], reports.map { |r| r["full_marks"] }.uniq, "in the worker, Ruby's own majors are off"
    assert_equal 1, reports.map { |r| r["pid"] }.uniq.size, "one worker served them all"
    assert_equal 0, reports.last["inside"], "no major ran inside a request"
    between = reports.each_cons(2).sum { |a, b| b["before"] - a["after"] }
    assert_operator between, :>=, 2, "majors ran between requests (count #{reports.first['before']} -> #{reports.last['after']})"
  end

  def test_without_it_ruby_runs_its_majors_inside_requests_as_ever
    reports = gc_reports([])
    assert_equal [true], reports.map { |r| r["full_marks"] }.uniq, "the worker's GC as Ruby's default"
    assert_operator reports.last["inside"], :>=, 2, "control: this app needs majors, and they ran inside requests"
  end

  # GC.config is process state a fork inherits: with reforking, the mold a worker forks (it serves no
  # request, so nothing would run its majors) has Ruby's own majors back (after_refork runs in it and
  # writes what it sees), and the workers of both generations have them off.
  def test_with_refork_after_the_mold_keeps_ruby_own_majors_and_its_workers_do_not
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", <<~RUBY)
      refork_after 20
      after_refork { |_| File.write("#{dir}/mold_full_marks", GC.config[:rgengc_allow_full_mark].to_s) }
    RUBY
    server = start_server(["-c", "#{dir}/blackbuck.rb", "-l", "127.0.0.1:0", "--oob-major-gc"], app: "major_gc.ru", dir: dir)
    seen = {} # worker pid => its full_marks
    wait_for(60, "a worker forked by the mold of generation 1") do
      io = server.tcp
      report = JSON.parse(request(io, "GET", "/").body)
      io.close
      seen[report["pid"]] = report["full_marks"]
      seen.size >= 2
    end
    assert_equal "true", File.read("#{dir}/mold_full_marks"), "the mold: Ruby's own majors"
    assert_equal [false], seen.values.uniq, "workers of generations 0 and 1: #{seen.inspect}"
  end
end
