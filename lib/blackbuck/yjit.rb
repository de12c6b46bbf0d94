# frozen_string_literal: true

require "rbconfig"
require "open3"
require_relative "errors"

module Blackbuck
  # YJIT as the master sets it up (`yjit`, `yjit_mem_size`) and reports it at boot.
  #
  # Its memory limit can only be given before YJIT starts, and each Ruby names it its own way:
  # - Ruby 4.0: `RubyVM::YJIT.enable(mem_size: MiB)`, so the master enables it in place, before
  #   the app loads (an app's own enable, Rails' `config.yjit`, is then a no-op);
  # - Ruby 3.4: only `--yjit-mem-size=MiB` on the command line or in RUBYOPT (code and metadata);
  # - Ruby 3.1 to 3.3: only `--yjit-exec-mem-size=MiB` (the code region alone).
  # So on 3.1 to 3.4 the blackbuck command execs itself again at once with the option (same pid, as
  # for jemalloc), and under rackup or rails server, whose app is loaded already, a warning says how
  # to start them with it.
  module YJIT
    REEXEC_ENV = "BLACKBUCK_YJIT_REEXEC" # set on the re-exec: a process that has it never execs again
    MEM_FLAGS = %w[--yjit-mem-size --yjit-exec-mem-size].freeze # the newer first

    module_function

    def available? = defined?(RubyVM::YJIT) && RubyVM::YJIT.respond_to?(:enabled?)
    def enabled? = available? && RubyVM::YJIT.enabled?

    # Ruby 4.0's RubyVM::YJIT.enable(mem_size:).
    def enable_takes_mem_size?
      available? && RubyVM::YJIT.respond_to?(:enable) && RubyVM::YJIT.method(:enable).parameters.include?(%i[key mem_size])
    end

    # The option of this Ruby that limits YJIT's memory (MEM_FLAGS), asked of the Ruby itself: an
    # option it does not know makes it exit with an error.
    def mem_flag(ruby = RbConfig.ruby)
      @mem_flag ||= MEM_FLAGS.find do |flag|
        _out, status = Open3.capture2e({ "RUBYOPT" => nil }, ruby, "#{flag}=16", "-e", "")
        status.success?
      end
    end

    # The memory limit this process started with, from its command line or RUBYOPT: [flag, MiB], or nil.
    def started_with(cmdline: read_cmdline, rubyopt: ENV.fetch("RUBYOPT", ""))
      (cmdline + rubyopt.split).reverse_each do |arg|
        flag, value = arg.split("=", 2)
        return [flag, value.to_i] if MEM_FLAGS.include?(flag) && value.to_s.match?(/\A\d+\z/)
      end
      nil
    end

    def read_cmdline
      File.read("/proc/self/cmdline").split("\0")
    rescue SystemCallError
      []
    end

    # What to do about `yjit` (want) and `yjit_mem_size` (mib) in a process whose YJIT is as given:
    #   [:nothing]             as asked already, or nothing asked
    #   [:enable, mib or nil]  RubyVM::YJIT.enable here (with mem_size: where it takes one)
    #   [:reexec, [options]]   exec again with these Ruby options (reexec: whether this process may)
    #   [:warn, text] / [:error, text]
    def plan(want:, mib:, available:, enabled:, takes_mem_size:, started_with:, can_enable:, reexec:, reexecuted: false)
      return [:nothing] unless want || mib
      return [:error, "#{mib ? "yjit_mem_size #{mib}" : 'yjit'} is set, but this Ruby has no YJIT (built without it)"] unless available

      if enabled
        return [:nothing] if mib.nil? || started_with&.last == mib || @applied == mib

        why = "YJIT was started before the config was read#{" with #{started_with.join('=')}" if started_with}"
        return [:reexec, nil] if reexec && !reexecuted # the options are added by the caller (#options)

        return [:warn, "yjit_mem_size #{mib} is not applied: #{why}; start Ruby with RUBYOPT=\"#{mem_flag}=#{mib}\""]
      end
      return [:enable, mib] if mib.nil? ? can_enable : takes_mem_size
      return [:error, "yjit is set, but YJIT did not start after a restart with --yjit"] if reexecuted
      return [:reexec, nil] if reexec

      [:warn, "#{mib ? "yjit_mem_size #{mib}" : 'yjit'} is set, but this server was started by rackup or rails server " \
              "with the app loaded: start it with RUBYOPT=\"--yjit#{" #{mem_flag}=#{mib}" if mib}\""]
    end

    # The Ruby options a re-exec adds for mib (nil: just --yjit).
    def options(mib) = ["--yjit", *("#{mem_flag}=#{mib}" if mib)]

    # RubyVM::YJIT.enable, with mem_size: where given; remembers the limit for the boot line.
    def enable(mib)
      mib ? RubyVM::YJIT.enable(mem_size: mib) : RubyVM::YJIT.enable
      @applied = mib
    end

    # The limit this process applied itself (RubyVM::YJIT.enable(mem_size:)), or nil.
    def applied = @applied

    # The plan for this process and config.
    def plan_for(config, reexec:, env: ENV)
      plan(want: config[:yjit], mib: config[:yjit_mem_size], available: available?, enabled: enabled?,
           takes_mem_size: enable_takes_mem_size?, started_with: started_with(rubyopt: env.fetch("RUBYOPT", "")),
           can_enable: available? && RubyVM::YJIT.respond_to?(:enable), reexec: reexec, reexecuted: !env[REEXEC_ENV].nil?)
    end

    # The size of YJIT's code region in MiB, or nil (YJIT off, no /proc, or a Ruby that reserves the
    # region and maps it as it fills: 3.2 and later, whose runtime_stats have code_region_size).
    # Ruby 3.1 maps the whole region (--yjit-exec-mem-size) at start: its anonymous executable mapping.
    def code_mib(maps = "/proc/self/maps", enabled: enabled?, lazy: lazy_region?)
      return nil unless enabled && !lazy

      bytes = File.foreach(maps).sum do |line|
        range, perms, _offset, _dev, inode, path = line.split(" ", 6)
        next 0 unless perms.start_with?("r-x", "rwx") && inode == "0" && path.to_s.strip.empty?

        from, to = range.split("-").map { |h| h.to_i(16) }
        to - from
      end
      bytes.positive? ? (bytes + (1 << 20) - 1) >> 20 : nil
    rescue SystemCallError
      nil
    end

    def lazy_region? = enabled? && (RubyVM::YJIT.runtime_stats || {}).key?(:code_region_size)

    # The master's boot line.
    def line
      return "YJIT: off" unless enabled?

      stats = RubyVM::YJIT.runtime_stats || {}
      code = stats.values_at(:inline_code_size, :outlined_code_size).compact.sum
      unless stats.key?(:code_region_size) # Ruby 3.1: the whole region is mapped (#code_mib)
        mib = code_mib(lazy: false)
        return "YJIT: on, code region #{mib ? "#{mib} MiB" : 'of unknown size'}, #{code / 1024} KiB of it used at boot " \
               "(--yjit-exec-mem-size; see docs/DEPLOY.md, Memory)"
      end
      limit = if @applied then "#{@applied} MiB (yjit_mem_size: RubyVM::YJIT.enable(mem_size: #{@applied}))"
              elsif (given = started_with) then "#{given.last} MiB (#{given.first})"
              else "Ruby's default (set yjit_mem_size)"
              end
      "YJIT: on, memory limit #{limit}, #{code / 1024} KiB of code at boot (see docs/DEPLOY.md, Memory)"
    end
  end
end
