# frozen_string_literal: true

require "etc"
require "open3"
require_relative "servers"

module BlackbuckBench
  # What the numbers were measured on, and the environments servers are started with.
  module Machine
    SYSCTLS = %w[net/core/somaxconn net/ipv4/tcp_tw_reuse net/ipv4/ip_local_port_range
                 net/ipv4/tcp_max_syn_backlog].freeze

    module_function

    def describe
      cpu = File.read("/proc/cpuinfo")[/^model name\s*:\s*(.+)$/, 1].to_s.strip
      mem_kb = File.read("/proc/meminfo")[/^MemTotal:\s+(\d+)/, 1].to_i
      {
        "cpu" => cpu.empty? ? "unknown CPU" : cpu,
        "cores" => Etc.nprocessors,
        "memory_gb" => (mem_kb / 1024.0 / 1024).round(1),
        "kernel" => Etc.uname[:release],
        "os" => os_name,
        "ruby" => ServerRuby.current.description,
        "harness_ruby" => RUBY_DESCRIPTION,
        "server_ruby" => ServerRuby.current.to_h,
        "loadavg_at_start" => File.read("/proc/loadavg").split.first(3).join(" "),
        "sysctl" => SYSCTLS.to_h { |k| [k.tr("/", "."), (File.read("/proc/sys/#{k}").strip.gsub(/\s+/, " ") rescue nil)] },
        "versions" => versions
      }
    end

    def os_name
      File.read("/etc/os-release")[/^PRETTY_NAME="?([^"\n]+)/, 1]
    rescue Errno::ENOENT
      "unknown"
    end

    def short(m) = "#{m['cpu']}, #{m['cores']} cores, #{m['memory_gb']} GB, Linux #{m['kernel']}, #{m['os']}"

    def capture(*cmd)
      out, = Open3.capture2e(server_env(bundled: false), *cmd, unsetenv_others: true)
      out.lines.first.to_s.strip
    rescue SystemCallError
      nil
    end

    def versions
      gems = capture(ServerRuby.current.ruby, "-e", 'puts %w[rack unicorn puma pitchfork iodine itsi-server falcon sinatra railties].map { |g| ' \
                                     '"#{g} #{Gem::Specification.find_all_by_name(g).map(&:version).max || "absent"}" }.join(", ")')
      root = File.expand_path("../../..", __dir__)
      lock = File.read(File.join(root, "Gemfile.lock")) rescue ""
      version = File.read(File.join(root, "lib/blackbuck/version.rb"))[/VERSION\s*=\s*"([^"]+)"/, 1] rescue nil
      { "bundle (blackbuck)" => "blackbuck #{version || '?'}, rack #{lock[/^    rack \(([\d.]+)\)/, 1] || '?'}",
        "gems outside the bundle (peers)" => gems,
        "nginx" => (capture("nginx", "-v") || capture("/usr/sbin/nginx", "-v")).to_s.sub("nginx version: ", ""),
        "wrk" => capture("wrk", "-v").to_s.split(" Copyright").first,
        "h2load" => capture("h2load", "--version") }
    end

    # Environment for a server. Peers run outside the bundle (see servers.rb) with GEM_PATH =
    # bench/setup's gem dir + the system gem dirs; blackbuck runs `bundle exec` against the
    # project's Gemfile (or `gemfile`). Either way no Bundler state of the harness itself
    # (RUBYOPT=-rbundler/setup under `bundle exec rake`) leaks into the server.
    # preload: a file every peer requires first (RUBYOPT=-r), e.g. to activate Rack 2.2 for Rails.
    def server_env(bundled:, gemfile: nil, preload: nil, extra: {})
      env = if defined?(Bundler) && Bundler.respond_to?(:unbundled_env)
              Bundler.unbundled_env
            else
              ENV.to_h
            end
      env = env.reject do |k, _|
        k.start_with?("BUNDLE_", "BUNDLER_", "GEM_") || %w[RUBYOPT RUBYLIB RUBY_YJIT_ENABLE RUBY_MN_THREADS LD_PRELOAD].include?(k)
      end
      ruby = ServerRuby.current
      if bundled
        env["BUNDLE_GEMFILE"] = gemfile || File.expand_path("../../../Gemfile", __dir__)
        env["PATH"] = [ruby.bin, env["PATH"]].compact.join(":")
      else
        env["GEM_PATH"] = [ruby.gem_home, *ruby.default_gem_path].uniq.join(":")
        env["RUBYOPT"] = "-r#{preload}" if preload
        env["PATH"] = [File.join(ruby.gem_home, "bin"), ruby.bin, env["PATH"]].compact.join(":")
      end
      env["RACK_ENV"] = "none"
      env.merge(extra)
    end
  end
end
