# frozen_string_literal: true

require "etc"
require "stringio"
require "socket"
require_relative "errors"
require_relative "version" # Blackbuck.rack_version

module Blackbuck
  # What the master does with the loaded app before it forks the first worker, so every worker
  # starts from a warm, compact, shared heap instead of paying the first requests' costs itself
  # (both steps are started by AppSource alone: it knows which process holds the app):
  #
  # 1. #run (Server.run, before binding; or the mold that boots the app): the `warmup` directive's
  #    paths, requested through the app in this process (lazy constants, routes, templates, caches
  #    are built once and shared by copy on write), then its block, given the app. A path that
  #    raises or answers 5xx, or a block that raises, is a boot failure (ConfigError: one line,
  #    exit 1), as a config.ru that raises.
  #    Then what the warm-up connected is let go: Active Record's pools are disconnected, and any
  #    other socket it left open is named in a warning (Descriptors), since every worker would
  #    share it.
  # 2. Warmup.prepare_heap (AppSource#prepare_heap from Supervisor#run, right before the first fork;
  #    gc_before_fork): Heap.
  #    (A mold prepares its own before it forks workers: Mold#prepare_heap.)
  class Warmup
    # The block given the app; the paths, requested in order. logger: the master's.
    def initialize(config, app, logger)
      @paths = config[:warmup_paths]
      @block = config[:warmup]
      @app = app
      @logger = logger
      @base_env = Request.base_env(config)
    end

    def self.wanted?(config) = !config[:warmup_paths].empty? || !config[:warmup].nil?

    # Runs the warm-up and logs its line; raises ConfigError when it fails.
    def run
      before = Descriptors.snapshot
      started = now
      answers = @paths.map { |path| request(path) }
      call_block
      seconds = now - started
      disconnected = Warmup.disconnect_active_record
      @logger.info("warm-up: #{describe(answers)} in #{format('%.2f', seconds)} s" \
                   "#{'; Active Record pools disconnected' if disconnected}")
      Descriptors.new(before, Descriptors.snapshot).left_sockets.each { |line| @logger.warn("warm-up left #{line}") }
      seconds
    end

    # Active Record's connections opened by the warm-up are closed, so no worker inherits (and
    # shares with its siblings) one; each worker connects on its first query. True when done.
    # clear_all_connections! disconnects every pool of the handler on Rails 6.1 and 7.2 alike
    # (7.2: every role when given none).
    def self.disconnect_active_record
      return false unless defined?(::ActiveRecord::Base) && ::ActiveRecord::Base.respond_to?(:connection_handler)

      ::ActiveRecord::Base.connection_handler.clear_all_connections!
      true
    end

    # Seconds spent preparing the heap for fork (Heap). logger: where its line goes, or nil.
    def self.prepare_heap(logger: nil, compact: true)
      heap = Heap.new(compact: compact)
      seconds = heap.prepare
      logger&.info("heap prepared for fork in #{format('%.2f', seconds)} s: #{heap.summary}")
      seconds
    end

    # "RuntimeError: boom (app/models/post.rb:12)": the message's first line and the first frame
    # outside Blackbuck, where the app raised.
    def self.error_text(err)
      own = File.expand_path("..", __dir__)
      frame = (err.backtrace || []).find { |l| !File.expand_path(l.split(":", 2).first).start_with?("#{own}/") }
      "#{err.class}: #{err.message.lines.first&.chomp}#{" (#{frame.split(':in ', 2).first})" if frame}"
    end

    private

    # One warm-up request: its status, or a ConfigError for a 5xx or an exception.
    def request(path)
      status = Request.new(@app, @base_env, path).call
      raise ConfigError, "warm-up: GET #{path} answered #{status}" if status >= 500

      @logger.warn("warm-up: GET #{path} answered #{status}; booting anyway") if status >= 400
      [path, status]
    rescue ConfigError
      raise
    rescue ScriptError, StandardError => e
      raise ConfigError, "warm-up: GET #{path} raised #{Warmup.error_text(e)}"
    end

    def call_block
      @block&.call(@app)
    rescue ScriptError, StandardError => e
      raise ConfigError, "warm-up: the warmup block raised #{Warmup.error_text(e)}"
    end

    # "3 paths (/ 200, /posts 200, /login 302) and the warmup block"
    def describe(answers)
      parts = []
      parts << "#{answers.size} path#{'s' unless answers.size == 1} (#{answers.map { |p, s| "#{p} #{s}" }.join(', ')})" \
        unless answers.empty?
      parts << "the warmup block" if @block
      parts.join(" and ")
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # One GET through the app, as a worker would run it for a request from 127.0.0.1 with
    # "Host: localhost" arriving on a UNIX socket (SERVER_NAME localhost, SERVER_PORT 80); the
    # body read whole and closed (Rack requires close), then the rack.response_finished callbacks.
    class Request
      # The env every warm-up request starts from: a listener's template (Listener#build_env_template,
      # the keys each worker's requests start from), without hijacking (nobody holds the socket).
      def self.base_env(config)
        listener = Listener.new(io: nil, kind: :unix, path: "warm-up")
        listener.build_env_template(Blackbuck.rack_version, config[:threads] > 1).merge("rack.hijack?" => false).freeze
      end

      def initialize(app, base_env, path)
        @app = app
        @path = path
        @env = base_env.dup
      end

      # The response's status (Integer).
      def call
        fill_env
        status, headers, body = @app.call(@env)
        begin
          drain(body)
        ensure
          body.close if body.respond_to?(:close)
          finished(status, headers)
        end
        Integer(status)
      end

      private

      def fill_env
        path_info, query = @path.split("?", 2)
        @env.update("REQUEST_METHOD" => "GET", "PATH_INFO" => path_info, "QUERY_STRING" => query.to_s,
                    "REQUEST_URI" => @path, "SERVER_PROTOCOL" => "HTTP/1.1", "HTTP_VERSION" => "HTTP/1.1",
                    "HTTP_HOST" => "localhost", "REMOTE_ADDR" => "127.0.0.1",
                    "rack.input" => StringIO.new(String.new(encoding: Encoding::BINARY)),
                    "rack.response_finished" => [])
      end

      # Every part of the body is produced, as a worker writing it would (a view renders lazily
      # in some bodies). A streaming body (Rack 3 `call`) is given a stream that keeps nothing.
      def drain(body)
        if body.respond_to?(:each) then body.each { |_part| nil }
        elsif body.respond_to?(:call) then body.call(NullStream.new)
        end
      end

      def finished(status, headers)
        @env["rack.response_finished"].each { |callback| callback.call(@env, status, headers, nil) }
      end
    end

    # The stream a streaming body writes to during the warm-up: accepts and drops everything.
    class NullStream
      def read(*) = nil
      def write(data) = data.to_s.bytesize
      def <<(_data) = self
      def flush = self
      def close_read = nil
      def close_write = nil
      def close = nil
      def closed? = false
    end

    # The master's open descriptors (/proc/self/fd) before and after the warm-up: the sockets it
    # opened and left open. Every worker inherits them: two processes then read and write one
    # database or Redis connection, and answers go to whichever reads first.
    class Descriptors
      FD_DIR = "/proc/self/fd"

      # fd => link target ("socket:[123]", "/path", "pipe:[4]"); {} without /proc.
      def self.snapshot
        Dir.children(FD_DIR).each_with_object({}) do |fd, links|
          links[Integer(fd)] = File.readlink("#{FD_DIR}/#{fd}")
        rescue SystemCallError
          nil # the directory's own descriptor, closed by now
        end
      rescue SystemCallError
        {}
      end

      def initialize(before, after)
        @before = before
        @after = after
      end

      # One warning line for each socket open now that was not before.
      def left_sockets
        @after.filter_map do |fd, link|
          next if @before[fd] == link || !link.start_with?("socket:")

          "socket fd #{fd} open (#{Descriptors.describe(fd)}): workers inherit it; " \
            "close it in the warmup block or reconnect in after_fork"
        end
      end

      # "TCP 127.0.0.1:5432" (the peer), "UNIX /run/redis.sock", "TCP listening on 0.0.0.0:9000".
      def self.describe(fd)
        sock = Socket.for_fd(fd)
        sock.autoclose = false # only looked at: the descriptor stays the app's
        type = sock.local_address.socktype == Socket::SOCK_DGRAM ? "UDP" : "TCP"
        type = "UNIX" if sock.local_address.unix?
        "#{type} #{peer(sock)}"
      rescue SystemCallError, IOError, SocketError
        "socket"
      end

      def self.peer(sock)
        addr = sock.remote_address
        addr.unix? ? addr.unix_path : addr.inspect_sockaddr
      rescue SystemCallError, SocketError
        local = sock.local_address
        "not connected, bound to #{local.unix? ? local.unix_path : local.inspect_sockaddr}"
      end
    end

    # The heap the workers will share, made ready for fork, before the first one. Why it matters:
    #
    # Neither Blackbuck (without gc_before_fork) nor Unicorn collects before forking: Unicorn's
    # `start` calls `build_app!` and then `spawn_missing_workers`, which forks (its only GC is OobGC,
    # in workers). Ruby collects only when an allocation finds no free slot, and a booting app grows
    # its heap page by page as it needs them, so the master forks with its heap wherever the app's
    # boot left it: full. It is not the server's boot that fills it: measured with a before_fork hook
    # (test/apps/rails, Rails 6.1, production, 2026-11-26), Blackbuck allocated 397 objects between
    # the end of config.ru and the fork, Unicorn 148, neither ran a GC in between; both forked with
    # less than 0.5 % of the slots free (Blackbuck 526 pages, 127 free slots; Unicorn 510 pages, 697
    # free) and nothing allocatable in reserve (heap_allocatable_pages 0). The numbers measured on a
    # larger Rails app (769 pages and 902 free slots, against Unicorn's 886 and 1,886) are the same
    # state at another point of the GC cycle: Unicorn loads its own code and config before the app,
    # so its GCs fall elsewhere in the boot and its heap had grown once more.
    #
    # A full heap is mostly not live: in that run, of 213,731 slots in use at the fork 84,157 were
    # garbage that no GC had swept yet (a full GC left 129,574). Forked like this, every worker, on
    # its own pages:
    # - collects within its first few hundred allocations (no free slot, no page in reserve), and
    #   that GC sweeps the master's garbage: freeing a slot writes the free list into its page, so
    #   every page holding garbage is copied, in every worker;
    # - ages the objects still young in the master (the age bits are in each object's flags, in the
    #   page): promotion writes to every page of young objects, per worker;
    # - computes a String's coderange (also in its flags) the first time it looks at it (a regexp,
    #   a comparison): another write into a shared page;
    # - grows its heap right away, by pages only it has.
    # So, once, in the master: coderanges computed, garbage swept and survivors promoted by full
    # GCs until no more objects become old, live objects compacted (the free slots the workers will
    # allocate into end up together in a few pages, not scattered over every page), and malloc's
    # free memory given back. Ruby >= 3.3 does these steps in Process.warmup; older Rubies get them
    # here. After it, in the run above: 84,940 free slots, 128,958 old objects of 129,574 live.
    class Heap
      MAX_FULL_GCS = 4 # full GCs at most while the number of old objects still grows
      STAT_KEYS = %i[heap_allocated_pages heap_free_slots heap_live_slots old_objects].freeze

      attr_reader :steps, :before, :after, :released_kib

      # compact: GC.compact too (on Ruby < 3.3; Process.warmup decides for itself).
      def initialize(compact: true)
        @compact = compact
        @steps = []
        @released_kib = nil
      end

      # Seconds spent.
      def prepare
        @before = GC.stat.slice(*STAT_KEYS)
        started = now
        if Process.respond_to?(:warmup)
          # Ruby 4.0's Process.warmup promotes every live object before it marks, so garbage made
          # just before it (the app's boot, the warm-up's requests) survived as old objects: 50,000
          # dead strings stayed in the heap of every worker. A full GC first sweeps them (3.4's
          # warmup did that itself; then the GC costs one more mark, a few ms).
          GC.start(full_mark: true, immediate_sweep: true)
          Process.warmup
          @steps << "full GC, Process.warmup"
        else
          emulate_warmup
        end
        @after = GC.stat.slice(*STAT_KEYS)
        now - started
      end

      # "Process.warmup; heap pages 769 -> 700, free slots 902 -> 40,112, old objects ..."
      def summary
        counts = [%w[heap pages heap_allocated_pages], %w[free slots heap_free_slots],
                  %w[live slots heap_live_slots], %w[old objects old_objects]].map do |a, b, key|
          "#{a} #{b} #{Heap.num(@before[key.to_sym])} -> #{Heap.num(@after[key.to_sym])}"
        end
        "#{@steps.join(', ')}; #{counts.join(', ')}"
      end

      def self.num(n) = n.to_s.reverse.scan(/\d{1,3}/).join(",").reverse

      private

      def emulate_warmup
        coderanges
        full_gcs
        compact if @compact
        trim_malloc
      end

      # ascii_only? computes and stores a String's coderange when it is not known yet.
      def coderanges
        n = ObjectSpace.each_object(String, &:ascii_only?)
        @steps << "coderange of #{Heap.num(n)} strings"
      end

      # A full GC promotes each survivor one age further; old after three (RVALUE_OLD_AGE).
      def full_gcs
        runs = 0
        old = nil
        while runs < MAX_FULL_GCS && old != GC.stat(:old_objects)
          old = GC.stat(:old_objects)
          GC.start(full_mark: true, immediate_sweep: true)
          runs += 1
        end
        growing = old != GC.stat(:old_objects) # MAX_FULL_GCS reached first: the heap was still being promoted
        @steps << "#{runs} full GC#{'s' unless runs == 1}#{' (old objects still growing)' if growing}"
      end

      def compact
        moved = GC.stat(:total_moved_objects)
        GC.compact
        @steps << "GC.compact (#{Heap.num(GC.stat(:total_moved_objects) - moved)} objects moved)"
      rescue NotImplementedError
        @steps << "no GC.compact on this platform"
      end

      def trim_malloc
        rss = Heap.rss_kib
        trimmed = Native.malloc_trim
        @released_kib = rss && Heap.rss_kib ? [rss - Heap.rss_kib, 0].max : nil
        released = @released_kib ? "#{format('%.1f', @released_kib / 1024.0)} MiB released" : "done"
        @steps << (trimmed ? "malloc_trim: #{released}" : "malloc_trim: nothing to release")
      end

      # The resident set of this process, KiB (statm), or nil without /proc.
      def self.rss_kib
        File.read("/proc/self/statm").split[1].to_i * (Etc.sysconf(Etc::SC_PAGESIZE) / 1024)
      rescue SystemCallError
        nil
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
