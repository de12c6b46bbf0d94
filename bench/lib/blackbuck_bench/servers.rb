# frozen_string_literal: true

require_relative "../../apps/memory_rails/generate"
require_relative "server_ruby"

module BlackbuckBench
  # Every server's launch recipe, in one place. A recipe turns (app, workers, listeners, scratch
  # dir) into a command line plus whatever config file it needs, and says how to recognise the
  # server's workers (process title) and readiness (log lines). Fairness notes live in
  # bench/README.md, one section per recipe; keep the two in step.
  #
  # Peers are Debian's executables (unicorn, puma 5.6, nginx) or RubyGems' installed by
  # bench/setup into tmp/bench-gems (puma 8, iodine, pitchfork, itsi), all run OUTSIDE the bundle
  # with GEM_PATH = tmp/bench-gems + the system gem dirs (Machine.server_env): Debian's unicorn
  # and puma are not in the project's Gemfile, so under `bundle exec` they fail to load (raindrops
  # / "puma is not currently included in the bundle"). Outside the bundle they activate the
  # newest rack on that path, the bundle's Rack 3.2 that bench/setup installs there.
  #
  # Every Ruby recipe has a YJIT twin, NAME+yjit: the same command with RUBY_YJIT_ENABLE=1.
  # Which Ruby runs them is the run's (ServerRuby.current): bench/setup's gem directory of that
  # Ruby, its bin/ first on PATH.
  class Recipe
    attr_reader :name, :worker_re, :ready_re, :gem, :only, :reforked_re

    # gem: the RubyGems name bench/setup installs for it (its failure reason is shown when absent)
    # ruby: a Ruby server (gets a +yjit twin); yjit_variant: its twin runs only when named
    # threaded: runs only on the workloads that wait (Workload#threaded): Blackbuck with app threads
    # and Puma 8 with 2 threads, its yardstick there
    # only: the one workload it runs (the memory workload's rows: they boot its Rails app; the
    # streams workload's blackbuck-streams and puma8-2x32-mn); its YJIT twin runs there only too
    # reforked_re: a log line each re-forked worker prints; the memory workload waits for
    # workers - 1 of them (Puma's fork_worker), sending SIGURG when the warm-up did not trigger it
    # needs: ->(server_ruby) { nil, or why this recipe cannot run on that Ruby } (Debian's packages
    # are for Debian's 3.1; M:N threads need 3.3): such a recipe is left out of a default run there
    # and absent, with that reason, when named
    # summary and env may be lambdas, evaluated for the run's Ruby (a YJIT flag differs by Ruby)
    def initialize(name:, summary:, executable:, worker_re:, ready_re: nil, bundled: false, variant: false,
                   ruby: true, gem: nil, env: {}, yjit_variant: false, threaded: false, only: nil,
                   reforked_re: nil, needs: nil, &build)
      @name = name
      @needs = needs
      @only = only
      @reforked_re = reforked_re
      @threaded = threaded
      @variant = variant
      @summary = summary
      @executable = executable
      @worker_re = worker_re
      @ready_re = ready_re
      @bundled = bundled
      @ruby = ruby
      @gem = gem
      @env = env
      @yjit_variant = yjit_variant
      @build = build
    end

    def bundled? = @bundled

    def summary = @summary.respond_to?(:call) ? @summary.call : @summary

    def env = @env.respond_to?(:call) ? @env.call : @env

    # nil when it can run on that Ruby, else why not
    def unfit_for(server_ruby) = @needs&.call(server_ruby)

    def needs = @needs

    def threaded? = @threaded

    def ruby? = @ruby

    def yjit? = env["RUBY_YJIT_ENABLE"] == "1" || env["RUBYOPT"].to_s.include?("--yjit")

    # A variant (e.g. another scheduling policy) runs only when --servers names it.
    def variant? = @variant

    # The same server with YJIT on (every Ruby since 3.1 reads RUBY_YJIT_ENABLE=1 at boot, in
    # every process, forked workers included), YJIT's other options at that Ruby's defaults.
    def with_yjit
      env = @env
      Recipe.new(name: "#{name}+yjit", summary: -> { "#{summary}; RUBY_YJIT_ENABLE=1" }, executable: @executable,
                 worker_re: worker_re, ready_re: ready_re, bundled: @bundled, variant: @variant || @yjit_variant,
                 ruby: true, gem: @gem, threaded: @threaded, needs: @needs, only: @only,
                 env: -> { (env.respond_to?(:call) ? env.call : env).merge("RUBY_YJIT_ENABLE" => "1") }, &@build)
    end

    # nil when the server can run here, else the reason it is absent.
    def absent_reason(server_ruby = ServerRuby.current)
      unfit = unfit_for(server_ruby)
      return unfit if unfit

      path = @executable.call
      unless path
        why = @gem && Servers.install_failure(@gem)
        return why ? "gem install #{@gem} failed in bench/setup: #{why}" : "executable not found#{@gem ? " (run #{server_ruby.setup_hint})" : ''}"
      end
      return "#{path} is not executable" unless File.executable?(path)

      nil
    end

    def executable_path = @executable.call

    # => { argv: [...], chdir: dir }
    def command(ctx) = @build.call(ctx)
  end

  # Everything a recipe needs to build a command line.
  LaunchContext = Struct.new(:app_name, :app_path, :workers, :tcp_port, :unix_path, :dir,
                             :root, :upstream, keyword_init: true) do
    def tcp = "127.0.0.1:#{tcp_port}"

    def write(name, text)
      path = File.join(dir, name)
      File.write(path, text)
      path
    end
  end

  module Servers
    ROOT = File.expand_path("../../..", __dir__)
    # Where bench/setup installs the RubyGems peers of the run's Ruby (never the system, never the
    # bundle): tmp/bench-gems/MAJOR.MINOR.
    def self.gem_home = ServerRuby.current.gem_home

    # The run's Ruby's bundle executable (Blackbuck runs in the project's bundle of that Ruby).
    def self.bundle = File.join(ServerRuby.current.bin, "bundle")

    # needs: Debian's packages (unicorn 6.0, puma 5.6, ruby-railties 6.1) are built for its Ruby 3.1
    DEBIAN_RUBY = ->(r) { r.debian? ? nil : "Debian's package is built for Debian's Ruby 3.1; the run's Ruby is #{r.full_version}" }
    # needs: RUBY_MN_THREADS=1 (M:N threads) is read by Ruby >= 3.3 only
    MN_RUBY = ->(r) { r.mn_threads? ? nil : "RUBY_MN_THREADS (M:N threads) needs Ruby >= 3.3; the run's Ruby is #{r.full_version}" }
    MN = { "RUBY_MN_THREADS" => "1" }.freeze
    PUMA_RAILS_THREADS = 3  # Rails' default RAILS_MAX_THREADS since 7.2
    PUMA_MANY_THREADS = 5   # Puma 5's default max threads per worker, Rails' before 7.2
    PUMA_STREAM_THREADS = 32 # issue 35's Puma for streams: 32 threads per worker, on M:N threads
    NGINX_WORKER_CONNECTIONS = 4096
    NGINX_FRONT_WORKERS = 1 # the production-shape proxy: one nginx worker is enough for these rates
    NGINX_UPSTREAM_KEEPALIVE = 16 # idle upstream connections per nginx worker, as docs/DEPLOY.md
    BACKLOG = 1024 # same listen backlog for every server that lets us set it

    def self.which(name)
      ENV.fetch("PATH", "").split(":").map { |d| File.join(d, name) }.find { |p| File.executable?(p) }
    end

    def self.first_existing(*paths) = paths.compact.find { |p| File.executable?(p) }

    # An executable installed by bench/setup into GEM_HOME.
    def self.bench_bin(name) = first_existing(File.join(gem_home, "bin", name))

    # bench/setup's note of why a gem did not install, or nil.
    def self.install_failure(gem)
      path = File.join(gem_home, "absent", "#{gem}.txt")
      File.exist?(path) ? File.read(path).strip : nil
    end

    # Debian's puma gem version (the historical row): its /usr/bin/puma would otherwise activate
    # the newest puma on GEM_PATH, which is bench/setup's Puma 8.
    def self.debian_gem_version(name)
      Dir["/usr/{share,lib,lib/*}/rubygems-integration/*/specifications/#{name}-*.gemspec"]
        .filter_map { |f| File.basename(f, ".gemspec")[/\A#{name}-(\d[\w.]*)\z/, 1] }.max_by { |v| Gem::Version.new(v) }
    end

    def self.unicorn_like_config(ctx, extra = "")
      <<~RUBY
        worker_processes #{ctx.workers}
        listen "#{ctx.tcp}", backlog: #{BACKLOG}
        listen "#{ctx.unix_path}", backlog: #{BACKLOG}
        timeout 60
        #{extra}
      RUBY
    end

    def self.puma_config(ctx, threads)
      <<~RUBY
        workers #{ctx.workers}
        threads #{threads}, #{threads}
        bind "tcp://#{ctx.tcp}?backlog=#{BACKLOG}"
        bind "unix://#{ctx.unix_path}?backlog=#{BACKLOG}"
        preload_app!
        environment "none"
        log_requests false
        quiet
      RUBY
    end

    def self.nginx_temp_paths(ctx)
      %w[client_body proxy fastcgi uwsgi scgi].map { |t| "#{t}_temp_path #{ctx.dir}/nginx-#{t};" }.join("\n  ")
    end

    def self.nginx_config(ctx)
      # The ceiling: no Ruby at all. The same bytes each app sends: a fixed body for the hello
      # apps (Content-Length, as every HTTP/1.1 server can), a static 64 KiB file for big.ru.
      big = ctx.app_name == "big"
      File.write(File.join(ctx.dir, "big.bin"), "0123456789abcdef" * 4096) if big
      location = if big
                   "location = / { default_type application/octet-stream; root #{ctx.dir}; try_files /big.bin =404; }"
                 else
                   "location = / { default_type text/plain; return 200 \"hello world\\n\"; }"
                 end
      nginx_wrap(ctx, ctx.workers, location)
    end

    # The production shape (docs/DEPLOY.md): nginx in front of the Ruby server's UNIX socket with
    # upstream keep-alive. The client talks to nginx; nginx to the server.
    def self.nginx_front_config(ctx)
      location = <<~NGINX
        location / {
              proxy_pass http://app;
              proxy_http_version 1.1;
              proxy_set_header Connection "";
              proxy_set_header Host $host;
              proxy_set_header X-Forwarded-For $remote_addr;
              proxy_buffering on;
            }
      NGINX
      upstream = "upstream app { server unix:#{ctx.upstream} fail_timeout=0; keepalive #{NGINX_UPSTREAM_KEEPALIVE}; }"
      nginx_wrap(ctx, NGINX_FRONT_WORKERS, location, upstream)
    end

    def self.nginx_wrap(ctx, workers, location, upstream = "")
      # as root, nginx's workers would run as nobody and could not connect to a socket in the
      # harness's 0700 directory; as another user they run as that user anyway
      <<~NGINX
        #{Process.uid.zero? ? 'user root;' : ''}
        worker_processes #{workers};
        daemon off;
        master_process on;
        pid #{ctx.dir}/nginx.pid;
        error_log stderr notice;
        events { worker_connections #{NGINX_WORKER_CONNECTIONS}; }
        http {
          access_log off;
          #{nginx_temp_paths(ctx)}
          keepalive_requests 1000000;
          sendfile on;
          tcp_nodelay on;
          #{upstream}
          server {
            listen #{ctx.tcp} backlog=#{BACKLOG};
            listen unix:#{ctx.unix_path} backlog=#{BACKLOG};
            #{location}
          }
        }
      NGINX
    end

    # exe/ by path: the same binstub as `bundle exec blackbuck`, but it does not need the
    # project gem's executables registered by a fresh `bundle install`.
    # exe: the blackbuck executable (this tree's, or BENCH_BASE's for the base rows); the project's
    # bundle either way (the executable loads its own tree's lib/ by relative path).
    def self.blackbuck_command(ctx, *flags, exe: "exe/blackbuck")
      { argv: [bundle, "exec", exe, "-w", ctx.workers.to_s, *flags, "-l", ctx.tcp,
               "-l", "unix:#{ctx.unix_path}", ctx.app_path], chdir: ctx.root }
    end

    # Unicorn: Debian's 6.0 on Debian's Ruby 3.1, RubyGems' 6.1 (bench/setup) on another Ruby.
    def self.unicorn_path = ServerRuby.current.debian? ? which("unicorn") : bench_bin("unicorn")

    def self.unicorn_summary(rest) = -> { "#{ServerRuby.current.debian? ? 'Debian unicorn 6.0' : 'unicorn 6.1 (RubyGems)'}, #{rest}" }

    def self.unicorn_command(ctx, *prefix)
      conf = ctx.write("unicorn.conf.rb", unicorn_like_config(ctx, "preload_app true"))
      { argv: [*prefix, unicorn_path, "-E", "none", "-c", conf, ctx.app_path], chdir: ctx.dir }
    end

    def self.puma_command(ctx, exe, threads, *version)
      conf = ctx.write("puma.rb", puma_config(ctx, threads))
      { argv: [exe, *version, "-C", conf, ctx.app_path], chdir: ctx.dir }
    end

    # preload: a script `falcon host` loads before it forks the workers (Falcon's `preload`; none:
    # each worker loads the app itself)
    def self.falcon_config(ctx, preload: nil)
      <<~RUBY
        # Written by bench/lib/blackbuck_bench/servers.rb for `falcon host`.
        require "falcon/environment/rack"
        require "io/endpoint/composite_endpoint"
        require "io/endpoint/unix_endpoint"
        require "io/endpoint/host_endpoint"

        service "bench" do
          include Falcon::Environment::Rack

          rackup_path #{ctx.app_path.inspect}
          count #{ctx.workers}#{preload ? "\n          preload [#{preload.inspect}]" : ''}
          endpoint do
            listeners = IO::Endpoint.composite(
              IO::Endpoint.tcp("127.0.0.1", #{ctx.tcp_port}, reuse_address: true, backlog: #{BACKLOG}),
              IO::Endpoint.unix(#{ctx.unix_path.inspect}, backlog: #{BACKLOG})
            )
            Async::HTTP::Endpoint.parse("http://127.0.0.1:#{ctx.tcp_port}", listeners,
                                        protocol: Async::HTTP::Protocol::HTTP1)
          end
        end
      RUBY
    end

    # Iodine's CLI takes one listener (-b/-p); the UNIX socket is a second Iodine.listen made by
    # a rackup wrapper around the same app file. Iodine 0.7 on Debian's Ruby 3.1 (0.8 needs a
    # newer one): it loads the app before forking. Iodine 0.8 elsewhere: --preload (copy-on-write;
    # without it each worker loads the app) and -R (the app is a Rack::Builder file, as its
    # README's own benchmark runs it); its listeners take a URL (unix:///path for a UNIX socket).
    def self.iodine_command(ctx, threads)
      if ServerRuby.current.debian?
        listen = "Iodine.listen(service: :http, handler: app, address: #{ctx.unix_path.inspect}, port: 0)"
        flags = ["-b", "127.0.0.1", "-p", ctx.tcp_port.to_s]
      else
        listen = "Iodine.listen(service: :http, handler: app, url: #{"unix://#{ctx.unix_path}".inspect})"
        flags = ["-b", "http://#{ctx.tcp}", "--preload", "-R"]
      end
      wrapper = ctx.write("iodine.ru", <<~RUBY)
        app = Rack::Builder.parse_file(#{ctx.app_path.inspect})
        app = app.first if app.is_a?(Array) # Rack 2 returns [app, options]
        #{listen}
        run app
      RUBY
      { argv: [bench_bin("iodine"), "-w", ctx.workers.to_s, "-t", threads.to_s, *flags, wrapper], chdir: ctx.dir }
    end

    # Iodine's version on the run's Ruby (bench/setup: 0.7 on Debian's 3.1, 0.8 elsewhere).
    def self.iodine_version = ServerRuby.current.debian? ? "0.7" : "0.8"

    # Iodine's readiness: 0.7 logs "INFO: PID is running" per worker, 0.8 "(PID) worker starting up."
    IODINE_READY = /INFO: \d+ is running|\(\d+\) worker starting up\./

    # Blackbuck with flags: the plain row (no flags), a variant, or a threaded row.
    def self.blackbuck(name, summary, *flags, variant: false, threaded: false, root: ROOT, only: nil)
      exe = File.join(root.to_s, "exe/blackbuck")
      Recipe.new(
        name: name, summary: summary, variant: variant, threaded: threaded, only: only,
        executable: -> { root && first_existing(exe) },
        worker_re: /\Ablackbuck worker/,
        ready_re: /worker \d+ .*ready/,
        bundled: true
      ) { |ctx| blackbuck_command(ctx, *flags, exe: exe) }
    end

    # BENCH_BASE=DIR: a built checkout of another version (e.g. main: `git worktree add DIR main &&
    # (cd DIR && bundle exec rake compile)`). Its rows (variants: name them in --servers) run its
    # exe/blackbuck with the same flags as this tree's, interleaved with them in one run: a before and
    # after on the same machine at the same time.
    BASE_ROOT = ENV.fetch("BENCH_BASE", nil)

    def self.blackbuck_threads(name, threads, why)
      blackbuck(name, "blackbuck as above with --threads #{threads} (#{why}); only on the workloads that wait",
                "--threads", threads.to_s, threaded: true)
    end

    # mn: RUBY_MN_THREADS=1, Ruby's M:N thread scheduler (>= 3.3), as HttpArena's Puma entry runs
    def self.puma8(name, threads, why, threaded: false, mn: false, only: nil)
      Recipe.new(
        name: name, threaded: threaded, gem: "puma", env: mn ? MN : {}, needs: (MN_RUBY if mn), only: only,
        summary: "Puma 8 (RubyGems), workers N, threads #{threads}:#{threads}#{why}, preload_app!, environment none" \
                 "#{mn ? ', RUBY_MN_THREADS=1 (M:N threads)' : ''}",
        executable: -> { bench_bin("puma") },
        worker_re: /puma: cluster worker/,
        ready_re: /Worker \d+ \(PID: \d+\) booted/
      ) { |ctx| puma_command(ctx, bench_bin("puma"), threads) }
    end

    # mn: with RUBY_MN_THREADS=1 where the Ruby has M:N threads (HttpArena's Iodine entry: one
    # thread per worker, M:N)
    def self.iodine(name, threads, mn: false)
      env = -> { mn && ServerRuby.current.mn_threads? ? MN : {} }
      Recipe.new(
        name: name, gem: "iodine", env: env,
        summary: -> { "Iodine #{iodine_version} (RubyGems), -w N -t #{threads}#{iodine_version == '0.8' ? ' --preload -R' : ''}" \
                      "#{env.call.empty? ? '' : ', RUBY_MN_THREADS=1 (M:N threads, as HttpArena runs it)'}; " \
                      "a second Iodine.listen for the UNIX socket" },
        executable: -> { bench_bin("iodine") },
        worker_re: nil, # workers keep the master's title: every process but the master
        ready_re: IODINE_READY
      ) { |ctx| iodine_command(ctx, threads) }
    end

    BASE = [
      blackbuck("blackbuck", "bundle exec exe/blackbuck -w N -l 127.0.0.1:PORT -l unix:PATH, defaults (keep-alive on)"),
      blackbuck("blackbuck-batch",
                "blackbuck as above with --sched-batch: workers as SCHED_BATCH tasks, to show what sched_batch adds",
                "--sched-batch", variant: true),
      blackbuck("blackbuck-no-handoff",
                "blackbuck as above with --handoff-after 0: connections never move between workers",
                "--handoff-after", "0", variant: true),
      blackbuck("blackbuck-oob-major",
                "blackbuck as above with --oob-major-gc: Ruby 3.4's major GCs only between requests (issue 34)",
                "--oob-major-gc", variant: true),
      blackbuck("blackbuck-streams",
                "blackbuck as above with --streams (issue 35: a waiting stream body runs on a fiber); only on the streams workload",
                "--streams", only: "streams"),
      blackbuck("blackbuck-streams-2x5",
                "blackbuck as above with --streams --threads #{PUMA_MANY_THREADS} (issue 35, step 2: app threads hand " \
                "their streams to the loop); only on the streams workload",
                "--streams", "--threads", PUMA_MANY_THREADS.to_s, only: "streams"),
      blackbuck_threads("blackbuck-2x2", 2, "like Puma 8 with 2 threads"),
      blackbuck_threads("blackbuck-2x5", PUMA_MANY_THREADS, "like Puma 8 and Iodine 2x5"),
      blackbuck("blackbuck-base", "BENCH_BASE's blackbuck (another version), defaults", variant: true, root: BASE_ROOT),
      blackbuck("blackbuck-base-2x5", "BENCH_BASE's blackbuck with --threads #{PUMA_MANY_THREADS}",
                "--threads", PUMA_MANY_THREADS.to_s, variant: true, threaded: true, root: BASE_ROOT),
      Recipe.new(
        name: "unicorn", gem: "unicorn", # RubyGems' on a Ruby other than Debian's
        summary: unicorn_summary("worker_processes N, preload_app, -E none (no keep-alive by design)"),
        executable: -> { unicorn_path },
        worker_re: /unicorn.*worker\[\d+\]/,
        ready_re: /worker=\d+ ready/
      ) { |ctx| unicorn_command(ctx) },
      Recipe.new(
        name: "unicorn-batch",
        summary: "unicorn as above, started under `chrt -b 0` (SCHED_BATCH, like blackbuck --sched-batch): like for like",
        executable: -> { unicorn_path && which("chrt") },
        worker_re: /unicorn.*worker\[\d+\]/,
        ready_re: /worker=\d+ ready/,
        variant: true
      ) { |ctx| unicorn_command(ctx, "chrt", "-b", "0") },
      Recipe.new(
        name: "puma5",
        summary: "Debian puma 5.6 (historical row), workers N, threads 1:1, preload_app!, environment none",
        executable: -> { debian_gem_version("puma") && first_existing("/usr/bin/puma") },
        worker_re: /puma: cluster worker/,
        ready_re: /Worker \d+ \(PID: \d+\) booted/,
        yjit_variant: true, needs: DEBIAN_RUBY
      ) { |ctx| puma_command(ctx, "/usr/bin/puma", 1, "_#{debian_gem_version('puma')}_") },
      Recipe.new(
        name: "puma5-2x5",
        summary: "Debian puma 5.6, workers N, threads #{PUMA_MANY_THREADS}:#{PUMA_MANY_THREADS} (Puma 5's default max)",
        executable: -> { debian_gem_version("puma") && first_existing("/usr/bin/puma") },
        worker_re: /puma: cluster worker/,
        ready_re: /Worker \d+ \(PID: \d+\) booted/,
        variant: true, needs: DEBIAN_RUBY
      ) { |ctx| puma_command(ctx, "/usr/bin/puma", PUMA_MANY_THREADS, "_#{debian_gem_version('puma')}_") },
      puma8("puma8-2x1", 1, " (the prefork servers' concurrency)"),
      puma8("puma8-2x2", 2, "; only on the workloads that wait, beside blackbuck-2x2", threaded: true),
      puma8("puma8-2x3", PUMA_RAILS_THREADS, " (Rails' default)"),
      puma8("puma8-2x5", PUMA_MANY_THREADS, ""),
      puma8("puma8-2x3-mn", PUMA_RAILS_THREADS, " (Rails' default)", mn: true),
      puma8("puma8-2x5-mn", PUMA_MANY_THREADS, "", mn: true),
      # the streams workload's Puma with many threads (a thread per stream; M:N makes a thread cheap)
      puma8("puma8-2x32-mn", PUMA_STREAM_THREADS, "; only on the streams workload", mn: true, only: "streams"),
      Recipe.new(
        name: "pitchfork", gem: "pitchfork",
        summary: "pitchfork 0.18 (RubyGems), worker_processes N, -E none (no keep-alive by design, like Unicorn)",
        executable: -> { bench_bin("pitchfork") || which("pitchfork") },
        worker_re: /pitchfork.*worker\[\d+\]/,
        ready_re: /worker=\d+ gen=\d+ .*ready/
      ) do |ctx|
        conf = ctx.write("pitchfork.conf.rb", unicorn_like_config(ctx))
        { argv: [bench_bin("pitchfork") || "pitchfork", "-E", "none", "-c", conf, ctx.app_path], chdir: ctx.dir }
      end,
      iodine("iodine-2x1", 1, mn: true),
      iodine("iodine-2x5", PUMA_MANY_THREADS),
      Recipe.new(
        name: "itsi-2x1", gem: "itsi-server",
        summary: "Itsi 0.2 (RubyGems, Rust core), workers N, threads 1, preload, ruby_thread_request_backlog_size #{BACKLOG}",
        executable: -> { bench_bin("itsi") },
        worker_re: nil, # workers keep the master's title: every process but the master
        ready_re: /single_mode: \{"binds"/
      ) do |ctx|
        # Itsi answers 503 once a worker's queue for its Ruby threads holds 30 x threads requests;
        # the others queue in the listen backlog, so Itsi's queue gets the same size.
        conf = ctx.write("Itsi.rb", <<~RUBY)
          workers #{ctx.workers}
          threads 1
          preload true
          bind "http://#{ctx.tcp}"
          bind "unix://#{ctx.unix_path}"
          ruby_thread_request_backlog_size #{BACKLOG}
        RUBY
        { argv: [bench_bin("itsi"), "-C", conf, "-r", ctx.app_path], chdir: ctx.dir }
      end,
      # Falcon's production command (`falcon host`, its docs' deployment guide) with a service of
      # Falcon::Environment::Rack: N forked workers (`count`), each a fiber per request; one endpoint
      # that binds both listeners (IO::Endpoint.composite), which `falcon serve --bind` cannot.
      Recipe.new(
        name: "falcon", gem: "falcon",
        summary: "Falcon 0.57 (RubyGems), `falcon host` with Falcon::Environment::Rack, count N (forked workers, " \
                 "a fiber per request), one composite endpoint for both listeners, HTTP/1",
        executable: -> { bench_bin("falcon") },
        worker_re: nil, # workers keep the master's title: every process but the master
        ready_re: nil   # ready when both sockets accept (the probe)
      ) do |ctx|
        conf = ctx.write("falcon.rb", falcon_config(ctx))
        { argv: [bench_bin("falcon"), "host", conf], chdir: ctx.dir }
      end,
      Recipe.new(
        name: "nginx", ruby: false,
        summary: "nginx worker_processes N, `return 200` (static file for the 64 KiB app): the ceiling",
        executable: -> { nginx_path },
        worker_re: /nginx: worker process/
      ) do |ctx|
        conf = ctx.write("nginx.conf", nginx_config(ctx))
        { argv: [nginx_path, "-e", "stderr", "-p", ctx.dir, "-c", conf], chdir: ctx.dir }
      end
    ].freeze

    # nginx in front of a Ruby server (the mixed workload's production shape); not a row itself.
    FRONT = Recipe.new(
      name: "nginx-front", ruby: false,
      summary: "nginx, 1 worker, proxy_pass to the server's UNIX socket, upstream keepalive 16 (docs/DEPLOY.md)",
      executable: -> { nginx_path },
      worker_re: /nginx: worker process/
    ) do |ctx|
      conf = ctx.write("nginx.conf", nginx_front_config(ctx))
      { argv: [nginx_path, "-e", "stderr", "-p", ctx.dir, "-c", conf], chdir: ctx.dir }
    end

    # --- The memory workload's rows (issue 24): each server on the generated Rails app
    # (bench/apps/memory_rails), 4 workers of 1 thread, preloaded where the server can, in the
    # app's directory (its sqlite3 path is relative). Blackbuck runs in the app's own bundle (its
    # Gemfile names this checkout, as a user's would); the peers outside it, with the Rails gem
    # directory on GEM_PATH, so that config/boot.rb's bundler/setup finds the versions they
    # activated already (rack 3.2.8, logger, nio4r: the same in both directories).
    JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    YJIT_EXEC_MEM_MB = 256 # Ruby 3.1's default --yjit-exec-mem-size, written out so the report shows it
    REFORK_AFTER = "refork_after [50, 100, 1000]" # the same directive for Blackbuck and Pitchfork

    # The generated app of the run's Ruby (Rails 8.1 on >= 3.2, 7.2 on 3.1), in this checkout's
    # tmp/bench-rails-memory-X.Y; BENCH_MEMORY_APP=DIR: another one, made for that Ruby.
    def self.memory_app_dir = ENV.fetch("BENCH_MEMORY_APP") { MemoryRailsApp.dir_for(ServerRuby.current.full_version) }

    # Blackbuck with config-file lines (warmup, refork_after: directives another change adds; an
    # older Blackbuck exits on them with "unknown directive", and the row says so).
    def self.blackbuck_memory(name, summary, lines: [], env: {}, executable: -> { first_existing(File.join(ROOT, "exe/blackbuck")) })
      Recipe.new(name: name, summary: summary, only: "memory", bundled: true, env: env, executable: executable,
                 worker_re: /\Ablackbuck worker/, ready_re: /worker \d+ .*ready/) do |ctx|
        conf = lines.empty? ? [] : ["-c", ctx.write("blackbuck.rb", lines.map { |l| l.respond_to?(:call) ? l.call(ctx) : l }.join("\n") + "\n")]
        { argv: [bundle, "exec", File.join(ROOT, "exe/blackbuck"), "-w", ctx.workers.to_s, *conf, "-l", ctx.tcp,
                 "-l", "unix:#{ctx.unix_path}", "config.ru"], chdir: memory_app_dir }
      end
    end

    # `warmup "/a", "/b", ...`: every endpoint the workload loads
    WARMUP_LINE = ->(_ctx) { "warmup #{MemoryRailsApp.endpoints.map(&:inspect).join(', ')}" }

    def self.in_app_dir(cmd) = cmd.merge(chdir: memory_app_dir)

    MEMORY_BASE = [
      blackbuck_memory("blackbuck-defaults", "blackbuck -w 4, defaults (always preloaded)"),
      blackbuck_memory("blackbuck-warmup", "blackbuck -w 4, config `warmup` with every endpoint", lines: [WARMUP_LINE]),
      blackbuck_memory("blackbuck-refork", "blackbuck -w 4, config `#{REFORK_AFTER}`", lines: [REFORK_AFTER]),
      blackbuck_memory("blackbuck-warmup-refork", "blackbuck -w 4, config `warmup` (every endpoint) and `#{REFORK_AFTER}`",
                       lines: [WARMUP_LINE, REFORK_AFTER]),
      blackbuck_memory("blackbuck-defaults-jemalloc", "blackbuck -w 4, defaults, LD_PRELOAD=#{JEMALLOC}",
                       env: { "LD_PRELOAD" => JEMALLOC },
                       executable: -> { File.exist?(JEMALLOC) ? first_existing(File.join(ROOT, "exe/blackbuck")) : nil }),
      blackbuck_memory("blackbuck-warmup-jemalloc", "blackbuck -w 4, config `warmup`, LD_PRELOAD=#{JEMALLOC}",
                       lines: [WARMUP_LINE], env: { "LD_PRELOAD" => JEMALLOC },
                       executable: -> { File.exist?(JEMALLOC) ? first_existing(File.join(ROOT, "exe/blackbuck")) : nil }),
      # the targets' configuration: what docs/DEPLOY.md's "Memory" section recommends, all three
      # (jemalloc by its directive: the blackbuck command restarts itself with it preloaded)
      blackbuck_memory("blackbuck-warmup-refork-jemalloc",
                       "blackbuck -w 4, config `warmup` (every endpoint), `#{REFORK_AFTER}`, `jemalloc true`",
                       lines: [WARMUP_LINE, REFORK_AFTER, "jemalloc true"],
                       executable: -> { File.exist?(JEMALLOC) ? first_existing(File.join(ROOT, "exe/blackbuck")) : nil }),
      Recipe.new(name: "pitchfork-refork", gem: "pitchfork", only: "memory",
                 summary: "pitchfork 0.18, worker_processes 4, #{REFORK_AFTER}, -E none",
                 executable: -> { bench_bin("pitchfork") }, worker_re: /pitchfork.*worker\[\d+\]/,
                 ready_re: /worker=\d+ gen=\d+ .*ready/) do |ctx|
        conf = ctx.write("pitchfork.conf.rb", unicorn_like_config(ctx, REFORK_AFTER))
        in_app_dir(argv: [bench_bin("pitchfork"), "-E", "none", "-c", conf, "config.ru"])
      end,
      # Pitchfork on the same allocator: not a target, the comparison at equal footing
      Recipe.new(name: "pitchfork-refork-jemalloc", gem: "pitchfork", only: "memory",
                 summary: "pitchfork 0.18, worker_processes 4, #{REFORK_AFTER}, -E none, LD_PRELOAD=#{JEMALLOC}",
                 env: { "LD_PRELOAD" => JEMALLOC },
                 executable: -> { File.exist?(JEMALLOC) ? bench_bin("pitchfork") : nil }, worker_re: /pitchfork.*worker\[\d+\]/,
                 ready_re: /worker=\d+ gen=\d+ .*ready/) do |ctx|
        conf = ctx.write("pitchfork.conf.rb", unicorn_like_config(ctx, REFORK_AFTER))
        in_app_dir(argv: [bench_bin("pitchfork"), "-E", "none", "-c", conf, "config.ru"])
      end,
      Recipe.new(name: "puma8-preload", gem: "puma", only: "memory",
                 summary: "Puma 8, workers 4, threads 1:1, preload_app!",
                 executable: -> { bench_bin("puma") }, worker_re: /puma: cluster worker/,
                 ready_re: /Worker \d+ \(PID: \d+\) booted/) { |ctx| in_app_dir(puma_command(ctx, bench_bin("puma"), 1)) },
      # fork_worker: worker 0 serves and is the mold; after its first 1000 requests (Puma's default)
      # the master re-forks workers 1..3 from it, once. The row is read after that refork.
      Recipe.new(name: "puma8-fork-worker", gem: "puma", only: "memory",
                 summary: "Puma 8, workers 4, threads 1:1, fork_worker (refork after worker 0's 1000th request, or SIGURG); read after the refork",
                 executable: -> { bench_bin("puma") }, worker_re: /puma: cluster worker/,
                 ready_re: /Worker \d+ \(PID: \d+\) booted/, reforked_re: /Worker [1-9]\d* \(PID: \d+\) booted.*phase: 1/) do |ctx|
        conf = ctx.write("puma.rb", puma_config(ctx, 1).sub("preload_app!\n", "fork_worker\n"))
        in_app_dir(argv: [bench_bin("puma"), "-C", conf, "config.ru"])
      end,
      Recipe.new(name: "unicorn-preload", only: "memory", gem: "unicorn",
                 summary: unicorn_summary("worker_processes 4, preload_app true, -E none"),
                 executable: -> { unicorn_path }, worker_re: /unicorn.*worker\[\d+\]/,
                 ready_re: /worker=\d+ ready/) do |ctx|
        conf = ctx.write("unicorn.conf.rb", unicorn_like_config(ctx, "preload_app true"))
        in_app_dir(argv: [unicorn_path, "-E", "none", "-c", conf, "config.ru"])
      end,
      Recipe.new(name: "iodine-4x1", gem: "iodine", only: "memory", summary: -> { "Iodine #{iodine_version}, -w 4 -t 1 (app loaded before the fork)" },
                 executable: -> { bench_bin("iodine") }, worker_re: nil,
                 ready_re: IODINE_READY) { |ctx| in_app_dir(iodine_command(ctx, 1)) },
      # Pitchfork as it runs by default: no reforking, every worker forked from the mold that
      # loaded the app (Pitchfork has no preload_app: it always loads before forking)
      Recipe.new(name: "pitchfork-no-refork", gem: "pitchfork", only: "memory",
                 summary: "pitchfork 0.18, worker_processes 4, -E none, no reforking (its default)",
                 executable: -> { bench_bin("pitchfork") }, worker_re: /pitchfork.*worker\[\d+\]/,
                 ready_re: /worker=\d+ gen=\d+ .*ready/) do |ctx|
        conf = ctx.write("pitchfork.conf.rb", unicorn_like_config(ctx))
        in_app_dir(argv: [bench_bin("pitchfork"), "-E", "none", "-c", conf, "config.ru"])
      end,
      # the throughput row's Itsi.rb with 4 workers: preload true (copy-on-write), threads 1
      Recipe.new(name: "itsi-4x1", gem: "itsi-server", only: "memory",
                 summary: "Itsi 0.2, workers 4, threads 1, preload true, ruby_thread_request_backlog_size #{BACKLOG}",
                 executable: -> { bench_bin("itsi") }, worker_re: nil, ready_re: /single_mode: \{"binds"/) do |ctx|
        in_app_dir(fetch("itsi-2x1").command(ctx))
      end,
      # the throughput row's `falcon host` with count 4, and the Rails app preloaded as the other
      # servers have it: Falcon's `preload` script (its Rails guide's preload.rb) requires
      # config/environment.rb before the fork; without it each worker loads the app itself
      Recipe.new(name: "falcon-count4", gem: "falcon", only: "memory",
                 summary: "Falcon 0.57, `falcon host` with Falcon::Environment::Rack, count 4 (forked workers, " \
                          "a fiber per request), preload of config/environment.rb, HTTP/1",
                 executable: -> { bench_bin("falcon") }, worker_re: nil, ready_re: nil) do |ctx|
        preload = ctx.write("preload.rb", "require #{File.join(memory_app_dir, 'config', 'environment').inspect}\n")
        conf = ctx.write("falcon.rb", falcon_config(ctx, preload: preload))
        in_app_dir(argv: [bench_bin("falcon"), "host", conf])
      end
    ].freeze

    # Each memory row with YJIT (RUBYOPT, read by every process: --yjit-exec-mem-size written out),
    # and the warmup + refork row once more with a 64 MiB code region.
    # Each memory row with YJIT (RUBYOPT, read by every process). mem_mb nil: YJIT's limits as the
    # run's Ruby has them on a Ruby with YJIT by default (3.4: --yjit-mem-size 128 MiB), Ruby 3.1's
    # --yjit-exec-mem-size=256 written out on 3.1 (so the report shows it); 64: the warmup + refork
    # target's code region (docs/DEPLOY.md), --yjit-exec-mem-size on every Ruby (3.4 and 4.0 still
    # read it).
    def self.memory_yjit_opt(mem_mb)
      mem_mb ||= YJIT_EXEC_MEM_MB unless ServerRuby.current.yjit_by_default?
      mem_mb ? "--yjit --yjit-exec-mem-size=#{mem_mb}" : "--yjit"
    end

    def self.memory_yjit(recipe, mem_mb = nil, suffix = "+yjit")
      Recipe.new(name: "#{recipe.name}#{suffix}", summary: -> { "#{recipe.summary}; RUBYOPT=#{memory_yjit_opt(mem_mb)}" }, only: "memory",
                 executable: -> { recipe.executable_path }, worker_re: recipe.worker_re, ready_re: recipe.ready_re,
                 bundled: recipe.bundled?, gem: recipe.gem, env: -> { recipe.env.merge("RUBYOPT" => memory_yjit_opt(mem_mb)) },
                 reforked_re: recipe.reforked_re, needs: recipe.needs) { |ctx| recipe.command(ctx) }
    end

    # A memory row on jemalloc (LD_PRELOAD, as Debian's libjemalloc2 is preloaded in production):
    # every server with and without it, so that each ratio has the same allocator on both sides.
    def self.memory_jemalloc(recipe)
      Recipe.new(name: "#{recipe.name}-jemalloc", summary: -> { "#{recipe.summary}, LD_PRELOAD=#{JEMALLOC}" }, only: "memory",
                 executable: -> { File.exist?(JEMALLOC) ? recipe.executable_path : nil }, worker_re: recipe.worker_re,
                 ready_re: recipe.ready_re, bundled: recipe.bundled?, gem: recipe.gem,
                 env: -> { recipe.env.merge("LD_PRELOAD" => JEMALLOC) }, reforked_re: recipe.reforked_re,
                 needs: recipe.needs) { |ctx| recipe.command(ctx) }
    end

    # MEMORY_BASE, a jemalloc row for each row that has none there, each of those with YJIT, and the
    # target's rows with a 64 MiB code region.
    MEMORY_ALLOC = (MEMORY_BASE + MEMORY_BASE.reject { |r| r.name.include?("jemalloc") }
                                              .reject { |r| MEMORY_BASE.any? { |o| o.name == "#{r.name}-jemalloc" } }
                                              .map { |r| memory_jemalloc(r) }).freeze
    MEMORY = (MEMORY_ALLOC.flat_map { |r| [r, memory_yjit(r)] } +
              %w[blackbuck-warmup-refork blackbuck-warmup-refork-jemalloc pitchfork-refork-jemalloc].map do |name|
                memory_yjit(MEMORY_BASE.find { |r| r.name == name }, 64, "+yjit64")
              end).freeze

    # Every Ruby row has a YJIT twin; which of the two a run measures where is Plan's choice (the
    # twins of the threaded rows run only where YJIT is on by default).
    ALL = (BASE.flat_map { |r| r.ruby? ? [r, r.with_yjit] : [r] } + MEMORY).freeze

    def self.nginx_path = first_existing("/usr/sbin/nginx", which("nginx"))

    def self.names = ALL.map(&:name)

    # What a run measures when --servers is not given: every recipe but the variants.
    def self.default_names = ALL.reject(&:variant?).map(&:name)

    def self.fetch(name) = ALL.find { |r| r.name == name } || raise(ArgumentError, "unknown server #{name}")
  end
end
