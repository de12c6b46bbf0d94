# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "blackbuck/warmup"
require "socket"
require "stringio"
require "tmpdir"
require "open3"
require "rbconfig"

# The warmup and gc_before_fork settings, and what the master does with them before its first fork.
class WarmupConfigTest < Minitest::Test
  def load(source)
    Dir.mktmpdir("bb-test") do |d|
      File.write("#{d}/conf.rb", source)
      Blackbuck::Config::DSL.load(Blackbuck::Config.new, "#{d}/conf.rb")
    end
  end

  def test_defaults
    c = Blackbuck::Config.new
    assert_equal [], c[:warmup_paths]
    assert_nil c[:warmup]
    assert c[:gc_before_fork], "the GC step is on by default"
  end

  def test_directive_takes_paths_and_a_block
    c = load(%(warmup "/", "/posts?page=1"\nwarmup "/posts.json"\nwarmup { |app| app }\ngc_before_fork false\n))
    assert_equal ["/", "/posts?page=1", "/posts.json"], c[:warmup_paths], "paths add up over several lines"
    assert_equal :app, c[:warmup].call(:app)
    refute c[:gc_before_fork]
  end

  def test_bad_values_name_the_directive_and_the_line
    err = assert_raises(Blackbuck::ConfigError) { load(%(workers 2\nwarmup "posts"\n)) }
    assert_match(%r{conf\.rb:2: warmup_paths must be paths starting with /, got "posts"}, err.message)
    err = assert_raises(Blackbuck::ConfigError) { load("warmup\n") }
    assert_match(/conf\.rb:1: warmup needs paths, a block, or both/, err.message)
    err = assert_raises(Blackbuck::ConfigError) { load("gc_before_fork :maybe\n") }
    assert_match(/gc_before_fork must be true or false/, err.message)
    assert_raises(Blackbuck::ConfigError) { Blackbuck::Config.new.set(:warmup_paths, ["/a b"]) }
  end

  def test_paths_from_a_string
    c = Blackbuck::Config.new.set(:warmup_paths, "/a,/b")
    assert_equal ["/a", "/b"], c[:warmup_paths]
    assert_equal false, Blackbuck::Config.new.set(:gc_before_fork, "off")[:gc_before_fork]
  end
end

class WarmupRunTest < Minitest::Test
  # A Rack app that records each env and each body it gave, answering `status` for paths in
  # `answers` (200 otherwise), raising for /raise.
  class App
    Body = Struct.new(:parts, :closed, :read) do
      def each
        self.read = true
        parts.each { |p| yield p }
      end

      def close = self.closed = true
    end

    attr_reader :envs, :bodies

    def initialize(answers = {})
      @answers = answers
      @envs = []
      @bodies = []
    end

    def call(env)
      raise ArgumentError, "no such post" if env["PATH_INFO"] == "/raise"

      @envs << env
      @bodies << Body.new(["hello"], false, false)
      [@answers.fetch(env["PATH_INFO"], 200), {}, @bodies.last]
    end
  end

  def setup
    @log = StringIO.new
    @logger = Blackbuck::Logger.new(@log)
  end

  def warmup(app, paths: [], block: nil)
    config = Blackbuck::Config.new.set(:warmup_paths, paths)
    config.set(:warmup, block) if block
    Blackbuck::Warmup.new(config, app, @logger)
  end

  def test_each_path_is_a_get_through_the_app_with_its_body_read_and_closed
    app = App.new
    finished = []
    app.define_singleton_method(:call) do |env|
      env["rack.response_finished"] << ->(*) { finished << env["PATH_INFO"] }
      App.instance_method(:call).bind_call(self, env)
    end
    seconds = warmup(app, paths: ["/", "/posts?page=2"]).run
    assert_kind_of Float, seconds
    first, second = app.envs
    assert_equal %w[GET / localhost 127.0.0.1 localhost 80], first.values_at(
      "REQUEST_METHOD", "PATH_INFO", "HTTP_HOST", "REMOTE_ADDR", "SERVER_NAME", "SERVER_PORT"
    )
    assert_equal ["/posts", "page=2", "HTTP/1.1"], second.values_at("PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL")
    assert_equal "", first["rack.input"].read
    assert_equal Blackbuck.rack_version, first["rack.version"]
    assert(app.bodies.all? { |b| b.read && b.closed }, "every body is read and closed")
    assert_equal ["/", "/posts"], finished, "rack.response_finished callbacks run"
    assert_match(%r{INFO warm-up: 2 paths \(/ 200, /posts\?page=2 200\) in \d+\.\d\d s$}, @log.string)
  end

  def test_the_block_is_given_the_app_after_the_paths
    app = App.new
    given = nil
    warmup(app, paths: ["/"], block: ->(a) { given = [a, app.envs.size] }).run
    assert_equal [app, 1], given
    assert_match(/warm-up: 1 path \(\/ 200\) and the warmup block in/, @log.string)
  end

  def test_a_5xx_or_an_exception_fails_the_boot_naming_the_path
    err = assert_raises(Blackbuck::ConfigError) { warmup(App.new("/down" => 503), paths: ["/", "/down"]).run }
    assert_equal "warm-up: GET /down answered 503", err.message
    err = assert_raises(Blackbuck::ConfigError) { warmup(App.new, paths: ["/raise"]).run }
    assert_match(%r{\Awarm-up: GET /raise raised ArgumentError: no such post \(.*warmup_test\.rb:\d+\)\z}, err.message)
    err = assert_raises(Blackbuck::ConfigError) { warmup(App.new, block: ->(_) { raise "cold" }).run }
    assert_match(/\Awarm-up: the warmup block raised RuntimeError: cold/, err.message)
  end

  def test_a_4xx_is_a_warning
    warmup(App.new("/login" => 401), paths: ["/login"]).run
    assert_match(%r{WARN warm-up: GET /login answered 401; booting anyway}, @log.string)
    assert_match(%r{INFO warm-up: 1 path \(/login 401\)}, @log.string)
  end

  def test_a_socket_left_open_is_named
    server = TCPServer.new("127.0.0.1", 0)
    port = server.addr[1]
    kept = nil
    warmup(App.new, block: ->(_) { kept = TCPSocket.new("127.0.0.1", port) }).run
    fd = kept.fileno
    assert_match(/WARN warm-up left socket fd #{fd} open \(TCP 127\.0\.0\.1:#{port}\): workers inherit it; close it in the warmup block or reconnect in after_fork/, @log.string)
    closed = StringIO.new
    Blackbuck::Warmup.new(Blackbuck::Config.new.set(:warmup, ->(_) { TCPSocket.new("127.0.0.1", port).close }),
                          App.new, Blackbuck::Logger.new(closed)).run
    refute_match(/left socket/, closed.string, "a socket closed in the block is not warned about")
  ensure
    kept&.close
    server&.close
  end

  # A stand-in Active Record in its own process: its pools are disconnected after the warm-up.
  def test_active_record_pools_are_disconnected
    script = <<~RUBY
      module ActiveRecord
        class Base
          HANDLER = Object.new
          def HANDLER.clear_all_connections!(*) = $cleared = true
          def self.connection_handler = HANDLER
        end
      end
      require "blackbuck"
      require "blackbuck/warmup"
      log = StringIO.new
      config = Blackbuck::Config.new.set(:warmup, ->(_) {})
      Blackbuck::Warmup.new(config, ->(_) {}, Blackbuck::Logger.new(log)).run
      print $cleared, " ", log.string
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path('../../lib', __dir__)}", "-rstringio",
                                      "-e", script)
    assert status.success?, err
    assert_match(/\Atrue .*warm-up: the warmup block in .* s; Active Record pools disconnected$/, out)
  end
end

class WarmupHeapTest < Minitest::Test
  def test_prepare_heap_collects_promotes_and_compacts
    junk = Array.new(50_000) { |i| "garbage #{i}" } # young garbage, once the reference goes
    junk = nil
    before = GC.stat
    log = StringIO.new
    seconds = Blackbuck::Warmup.prepare_heap(logger: Blackbuck::Logger.new(log))
    after = GC.stat
    assert_nil junk
    assert_kind_of Float, seconds
    assert_operator seconds, :>, 0
    assert_operator after[:major_gc_count], :>, before[:major_gc_count]
    # Swept, not promoted: the live slots drop by the 50,000 dead strings (4.0 then frees the empty
    # pages, so free slots are no measure of it).
    assert_operator after[:heap_live_slots], :<=, before[:heap_live_slots] - 40_000, "the garbage is swept in the master"
    young = after[:heap_live_slots] - after[:old_objects]
    assert_operator young, :<, after[:heap_live_slots] / 10, "survivors are old: workers do not promote them"
    line = log.string
    assert_match(/INFO heap prepared for fork in \d+\.\d\d s: /, line)
    assert_match(/heap pages [\d,]+ -> [\d,]+, free slots [\d,]+ -> [\d,]+, live slots [\d,]+ -> [\d,]+, old objects/, line)
    if Process.respond_to?(:warmup)
      assert_match(/Process\.warmup/, line)
    else
      assert_match(/coderange of [\d,]+ strings, \d full GCs?, /, line)
      assert_match(/malloc_trim: /, line)
      if GC.respond_to?(:compact) && !line.include?("no GC.compact")
        assert_operator after[:compact_count], :>, before[:compact_count], "GC.compact ran"
      end
    end
  end

  def test_coderange_is_computed
    skip "Process.warmup computes it inside Ruby" if Process.respond_to?(:warmup)

    heap = Blackbuck::Warmup::Heap.new
    heap.prepare
    assert_match(/coderange of [\d,]+ strings/, heap.steps.first)
    assert_operator heap.steps.size, :>=, 4, heap.steps.inspect
  end

  # The mold's step (Mold#prepare_heap): no compaction, so the pages it shares with the master stay shared.
  def test_the_mold_step_does_not_compact
    skip "Process.warmup decides for itself" if Process.respond_to?(:warmup)

    before = GC.stat(:compact_count)
    heap = Blackbuck::Warmup::Heap.new(compact: false)
    heap.prepare
    assert_equal before, GC.stat(:compact_count)
    refute(heap.steps.any? { |step| step.include?("compact") }, heap.steps.inspect)
  end
end
