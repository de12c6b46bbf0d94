# frozen_string_literal: true

module BlackbuckBench
  # Every server's launch recipe, in one place. A recipe turns (app, workers, listeners, scratch
  # dir) into a command line plus whatever config file it needs, and says how to recognise the
  # server's workers (process title) and readiness (log lines). Fairness notes live in
  # bench/README.md, one section per recipe; keep the two in step.
  #
  # Peers (unicorn, puma, pitchfork) are Debian's or RubyGems' executables run OUTSIDE the bundle
  # with the system gems: Debian's unicorn and puma are not in the project's Gemfile, so under
  # `bundle exec` they fail to load (raindrops / "puma is not currently included in the bundle").
  # Outside the bundle they activate the newest system rack, which is the same Rack 3.2 the bundle
  # uses (bench/setup checks this).
  class Recipe
    attr_reader :name, :summary

    def initialize(name:, summary:, executable:, worker_re:, ready_re: nil, bundled: false, variant: false, &build)
      @name = name
      @variant = variant
      @summary = summary
      @executable = executable
      @worker_re = worker_re
      @ready_re = ready_re
      @bundled = bundled
      @build = build
    end

    attr_reader :worker_re, :ready_re

    def bundled? = @bundled

    # A variant (e.g. another scheduling policy) runs only when --servers names it.
    def variant? = @variant

    # nil when the server can run here, else the reason it is absent.
    def absent_reason
      path = @executable.call
      return "executable not found" unless path
      return "#{path} is not executable" unless File.executable?(path)

      nil
    end

    def executable_path = @executable.call

    # => { argv: [...], chdir: dir }
    def command(ctx) = @build.call(ctx)
  end

  # Everything a recipe needs to build a command line.
  LaunchContext = Struct.new(:app_name, :app_path, :workers, :tcp_port, :unix_path, :dir,
                             :root, keyword_init: true) do
    def tcp = "127.0.0.1:#{tcp_port}"

    def write(name, text)
      path = File.join(dir, name)
      File.write(path, text)
      path
    end
  end

  module Servers
    ROOT = File.expand_path("../../..", __dir__)
    PUMA_THREADS_VARIANT = 5 # Puma 5's default max threads per worker
    NGINX_WORKER_CONNECTIONS = 4096
    BACKLOG = 1024 # same listen backlog for every server that lets us set it

    def self.which(name)
      ENV.fetch("PATH", "").split(":").map { |d| File.join(d, name) }.find { |p| File.executable?(p) }
    end

    def self.first_existing(*paths) = paths.find { |p| File.executable?(p) }

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
      <<~NGINX
        worker_processes #{ctx.workers};
        daemon off;
        master_process on;
        pid #{ctx.dir}/nginx.pid;
        error_log stderr notice;
        events { worker_connections #{NGINX_WORKER_CONNECTIONS}; }
        http {
          access_log off;
          client_body_temp_path #{ctx.dir}/nginx-body;
          proxy_temp_path #{ctx.dir}/nginx-proxy;
          fastcgi_temp_path #{ctx.dir}/nginx-fastcgi;
          uwsgi_temp_path #{ctx.dir}/nginx-uwsgi;
          scgi_temp_path #{ctx.dir}/nginx-scgi;
          keepalive_requests 1000000;
          sendfile on;
          tcp_nodelay on;
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
    def self.blackbuck_command(ctx, *flags)
      { argv: ["bundle", "exec", "exe/blackbuck", "-w", ctx.workers.to_s, *flags, "-l", ctx.tcp,
               "-l", "unix:#{ctx.unix_path}", ctx.app_path], chdir: ctx.root }
    end

    def self.unicorn_command(ctx, *prefix)
      conf = ctx.write("unicorn.conf.rb", unicorn_like_config(ctx, "preload_app true"))
      { argv: [*prefix, "unicorn", "-E", "none", "-c", conf, ctx.app_path], chdir: ctx.dir }
    end

    ALL = [
      Recipe.new(
        name: "blackbuck",
        summary: "bundle exec exe/blackbuck -w N -l 127.0.0.1:PORT -l unix:PATH, defaults (keep-alive on)",
        executable: -> { first_existing(File.join(ROOT, "exe/blackbuck")) },
        worker_re: /\Ablackbuck worker/,
        ready_re: /worker \d+ .*ready/,
        bundled: true
      ) { |ctx| blackbuck_command(ctx) },
      Recipe.new(
        name: "blackbuck-normal-sched",
        summary: "blackbuck as above with --no-sched-batch: workers as normal tasks, to show what sched_batch adds",
        executable: -> { first_existing(File.join(ROOT, "exe/blackbuck")) },
        worker_re: /\Ablackbuck worker/,
        ready_re: /worker \d+ .*ready/,
        bundled: true,
        variant: true
      ) { |ctx| blackbuck_command(ctx, "--no-sched-batch") },
      Recipe.new(
        name: "unicorn",
        summary: "Debian unicorn, worker_processes N, preload_app, -E none (no keep-alive by design)",
        executable: -> { which("unicorn") },
        worker_re: /unicorn.*worker\[\d+\]/,
        ready_re: /worker=\d+ ready/
      ) { |ctx| unicorn_command(ctx) },
      Recipe.new(
        name: "unicorn-batch",
        summary: "unicorn as above, started under `chrt -b 0` (SCHED_BATCH, like blackbuck's workers): like for like",
        executable: -> { which("unicorn") && which("chrt") },
        worker_re: /unicorn.*worker\[\d+\]/,
        ready_re: /worker=\d+ ready/,
        variant: true
      ) { |ctx| unicorn_command(ctx, "chrt", "-b", "0") },
      Recipe.new(
        name: "puma",
        summary: "Debian puma, workers N, threads 1:1, preload_app!, environment none",
        executable: -> { which("puma") },
        worker_re: /puma: cluster worker/,
        ready_re: /Worker \d+ \(PID: \d+\) booted/
      ) do |ctx|
        conf = ctx.write("puma.rb", puma_config(ctx, 1))
        { argv: ["puma", "-C", conf, ctx.app_path], chdir: ctx.dir }
      end,
      Recipe.new(
        name: "puma-threads",
        summary: "Debian puma, workers N, threads #{PUMA_THREADS_VARIANT}:#{PUMA_THREADS_VARIANT} (Puma 5's default max)",
        executable: -> { which("puma") },
        worker_re: /puma: cluster worker/,
        ready_re: /Worker \d+ \(PID: \d+\) booted/
      ) do |ctx|
        conf = ctx.write("puma.rb", puma_config(ctx, PUMA_THREADS_VARIANT))
        { argv: ["puma", "-C", conf, ctx.app_path], chdir: ctx.dir }
      end,
      Recipe.new(
        name: "pitchfork",
        summary: "pitchfork gem, worker_processes N, -E none (no keep-alive by design, like Unicorn)",
        executable: -> { which("pitchfork") },
        worker_re: /pitchfork.*worker\[\d+\]/,
        ready_re: /worker=\d+ gen=\d+ .*ready/
      ) do |ctx|
        conf = ctx.write("pitchfork.conf.rb", unicorn_like_config(ctx))
        { argv: ["pitchfork", "-E", "none", "-c", conf, ctx.app_path], chdir: ctx.dir }
      end,
      Recipe.new(
        name: "nginx",
        summary: "nginx worker_processes N, `return 200` (static file for the 64 KiB app): the ceiling",
        executable: -> { first_existing("/usr/sbin/nginx") || which("nginx") },
        worker_re: /nginx: worker process/
      ) do |ctx|
        conf = ctx.write("nginx.conf", nginx_config(ctx))
        { argv: [executable_path_for_nginx, "-e", "stderr", "-p", ctx.dir, "-c", conf], chdir: ctx.dir }
      end
    ].freeze

    def self.executable_path_for_nginx = first_existing("/usr/sbin/nginx") || which("nginx")

    def self.names = ALL.map(&:name)

    # What a run measures when --servers is not given: every recipe but the variants.
    def self.default_names = ALL.reject(&:variant?).map(&:name)

    def self.fetch(name) = ALL.find { |r| r.name == name } || raise(ArgumentError, "unknown server #{name}")
  end
end
