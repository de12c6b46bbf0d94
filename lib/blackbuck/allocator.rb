# frozen_string_literal: true

require "etc"
require "rbconfig"
require_relative "errors"
require_relative "yjit"

module Blackbuck
  # Which malloc this process runs on, and what the master sets about memory at boot: jemalloc
  # preloaded when asked (`jemalloc true`), glibc's arenas capped for threaded workers
  # (`malloc_arena_max`), and a line about YJIT's code region. docs/DEPLOY.md, "Memory", has
  # the measurements behind each.
  #
  # jemalloc cannot be switched on inside a running process: malloc is bound when the program
  # starts. So the blackbuck command, asked for it, execs itself again with LD_PRELOAD naming the
  # library (CLI, before the app loads); `rackup` and `rails server` have loaded the app before the
  # handler runs, and are only told how to start with it.
  class Allocator
    # Where Debian's libjemalloc2 (and other distributions' packages) put the library; the
    # first that exists is used, else the one `ldconfig -p` knows.
    JEMALLOC_PATHS = %w[
      /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib/aarch64-linux-gnu/libjemalloc.so.2
      /usr/lib64/libjemalloc.so.2 /usr/lib/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2
    ].freeze
    REEXEC_ENV = "BLACKBUCK_JEMALLOC_REEXEC" # set on the re-exec: a process that has it never execs again
    THREADED_ARENAS = 2 # glibc arenas with threads > 1 and no malloc_arena_max (measured: DEPLOY.md)

    # maps: the process's /proc maps file (tests pass a fake); paths: where to look for the library.
    def initialize(env: ENV, maps: "/proc/self/maps", paths: JEMALLOC_PATHS, ldconfig: -> { Allocator.ldconfig })
      @env = env
      @maps = maps
      @paths = paths
      @ldconfig = ldconfig
    end

    # The path of the jemalloc this process runs on, or nil. The maps file is the truth (an
    # LD_PRELOAD naming a missing file is ignored by ld.so); without /proc, LD_PRELOAD is believed.
    def jemalloc_loaded
      File.foreach(@maps) do |line|
        path = line.split(" ", 6)[5]&.strip
        return path if path && File.basename(path).start_with?("libjemalloc.so")
      end
      nil
    rescue SystemCallError
      @env["LD_PRELOAD"].to_s.split(/[\s:]+/).find { |p| File.basename(p).start_with?("libjemalloc.so") }
    end

    # The path of an installed libjemalloc, or nil.
    def jemalloc_installed
      @installed = @paths.find { |p| File.file?(p) } || @ldconfig.call unless defined?(@installed)
      @installed
    end

    # jemalloc is set: the installed library, else a ConfigError saying what to install.
    def jemalloc_required
      jemalloc_installed or
        raise ConfigError, "jemalloc is set, but no libjemalloc.so.2 is installed (Debian: apt-get install libjemalloc2)"
    end

    # `ldconfig -p`'s path of libjemalloc.so.2, or nil (also when there is no ldconfig).
    def self.ldconfig(text = nil)
      text ||= IO.popen(%w[ldconfig -p], err: File::NULL, &:read)
      text[/^\s*libjemalloc\.so\.2 .*=> (\S+)$/, 1]
    rescue SystemCallError
      nil
    end

    # The environment the re-exec runs with: jemalloc first in LD_PRELOAD (before what the user
    # preloads, so its malloc is the one bound), and the marker that stops a second re-exec.
    def reexec_env(lib)
      { "LD_PRELOAD" => [lib, @env["LD_PRELOAD"]].reject { |p| p.nil? || p.empty? }.join(":"), REEXEC_ENV => "1" }
    end

    # `jemalloc true` in the blackbuck command, before the app loads: nil when jemalloc is loaded,
    # else the environment to exec this command again with. A ConfigError when it is not installed,
    # or when the re-exec already happened and did not load it (ld.so ignores LD_PRELOAD for
    # set-user-ID programs): never a loop.
    def reexec_for_jemalloc
      reexecuted = @env.delete(REEXEC_ENV) # not handed to the app's subprocesses
      return nil if jemalloc_loaded

      lib = jemalloc_required
      if reexecuted
        raise ConfigError, "jemalloc is set, but restarting with LD_PRELOAD=#{@env['LD_PRELOAD']} did not load #{lib}"
      end

      reexec_env(lib)
    end

    # The command line to exec this process again: the same Ruby options (--yjit,
    # --yjit-exec-mem-size, -r ...) as /proc/self/cmdline shows before the script. When the
    # command line is not [ruby, options, script, *argv] (`bundle exec` runs the script inside its
    # own process and retitles it), RUBYOPT still holds Bundler's setup, and YJIT is passed on as
    # running now.
    def self.command(argv, script: $PROGRAM_NAME, cmdline: read_cmdline, yjit: YJIT.enabled?, code_mib: YJIT.code_mib)
      n = cmdline.size - argv.size - 1 # where the script is in [ruby, *options, script, *argv]
      options = if n >= 1 && cmdline.last(argv.size) == argv && File.expand_path(cmdline[n]) == File.expand_path(script)
                  cmdline[1...n]
                elsif yjit
                  ["--yjit", *("--yjit-exec-mem-size=#{code_mib}" if code_mib)]
                else []
                end
      [RbConfig.ruby, *options, File.expand_path(script), *argv]
    end

    def self.read_cmdline
      File.read("/proc/self/cmdline").split("\0")
    rescue SystemCallError # no /proc: YJIT's options as it runs (#command)
      []
    end
    private_class_method :read_cmdline

    # How many glibc arenas the master caps malloc at (Native.malloc_arena_max), or nil to leave
    # it. Threads in a worker each tend to get an arena of their own (up to 8 per core) whose free
    # pages add up; one thread uses the main arena only. MALLOC_ARENA_MAX in the environment was
    # read by glibc itself and stands unless malloc_arena_max is set; jemalloc has its own arenas.
    def arena_cap(setting, threads, jemalloc: jemalloc_loaded)
      return nil if jemalloc
      return setting if setting
      return nil if threads <= 1 || @env["MALLOC_ARENA_MAX"]

      THREADED_ARENAS
    end

    # At the master's boot (Server.run): says which malloc runs and caps the arenas. ConfigError
    # when jemalloc is set and not installed (the rack handler's path: the CLI said so before).
    def boot(config, logger)
      loaded = jemalloc_loaded
      if config[:jemalloc] && !loaded
        lib = jemalloc_required
        logger.warn("malloc: #{system_malloc}, though jemalloc is set: a server started by rackup or rails server " \
                    "cannot restart itself with it preloaded (the app is loaded already); start it with " \
                    "LD_PRELOAD=#{lib}, or with the blackbuck command")
      else
        logger.info(malloc_line(loaded))
      end
      cap = arena_cap(config[:malloc_arena_max], config[:threads], jemalloc: loaded)
      logger.info(arena_line(cap, config)) if cap && Native.malloc_arena_max(cap)
      yjit(config, logger)
    end

    # `yjit` and `yjit_mem_size` where the app is loaded already (rackup, rails server; the
    # blackbuck command applied them before it loaded the app: then this finds nothing to do),
    # then the YJIT line.
    def yjit(config, logger)
      step, arg = YJIT.plan_for(config, reexec: false, env: @env)
      case step
      when :enable then YJIT.enable(arg)
      when :warn then logger.warn("YJIT: #{arg}")
      when :error then raise ConfigError, arg
      end
      logger.info(YJIT.line) if YJIT.available?
    end

    private

    def malloc_line(loaded)
      return "malloc: jemalloc (#{loaded})" if loaded
      return "malloc: #{system_malloc}" unless (lib = jemalloc_installed)

      "malloc: #{system_malloc}; jemalloc is installed at #{lib} and unused (set jemalloc true): a small Rails " \
        "app's worker USS was 30% lower on it, see docs/DEPLOY.md, Memory"
    end

    def arena_line(cap, config)
      why = if config[:malloc_arena_max] then "malloc_arena_max"
            else "the default with #{config[:threads]} app threads; set malloc_arena_max to change it"
            end
      from_env = @env["MALLOC_ARENA_MAX"]
      "malloc: at most #{cap} glibc arenas (#{why}#{"; MALLOC_ARENA_MAX=#{from_env} overridden" if from_env})"
    end

    # glibc's malloc, or another libc's (musl, macOS): only glibc has arenas to cap.
    def system_malloc = defined?(Etc::CS_GNU_LIBC_VERSION) ? "glibc" : "the system's"
  end
end
