# frozen_string_literal: true

module Blackbuck
  # The CPUs a cgroup CPU quota gives this process (a container's `cpus:` limit, Kubernetes'
  # `resources.limits.cpu`, systemd's CPUQuota=), so the default worker count fits the quota
  # instead of the host's CPU count. cgroup v2: `cpu.max` ("QUOTA PERIOD" or "max PERIOD"); v1:
  # `cpu.cfs_quota_us` (-1 = none) over `cpu.cfs_period_us`. The process's own cgroup and every
  # ancestor up to the mount count: the smallest quota wins. nil when there is none (or no /proc).
  module CpuQuota
    module_function

    def cpus(proc_dir: "/proc/self")
      cgroups = File.readlines(File.join(proc_dir, "cgroup"), chomp: true)
      mounts = File.readlines(File.join(proc_dir, "mountinfo"), chomp: true).filter_map { |l| mount(l) }
      limits = cgroups.flat_map do |line|
        _id, controllers, path = line.split(":", 3)
        next [] unless path

        if controllers.empty? # v2
          dirs(mounts, path) { |m| m[:type] == "cgroup2" }.filter_map { |d| v2_limit(d) }
        elsif controllers.split(",").include?("cpu")
          dirs(mounts, path) { |m| m[:type] == "cgroup" && m[:options].include?("cpu") }.filter_map { |d| v1_limit(d) }
        else
          []
        end
      end
      limits.min
    rescue SystemCallError, IOError
      nil
    end

    # A mountinfo line -> {root:, point:, type:, options: [...]}.
    def mount(line)
      pre, post = line.split(" - ", 2)
      return nil unless post

      fields = pre.split
      type, _source, options = post.split
      { root: fields[3], point: fields[4], type: type, options: options.to_s.split(",") }
    end

    # The directories of cgroup `path` and its ancestors, under every matching mount.
    def dirs(mounts, path)
      mounts.select { |m| yield m }.flat_map do |m|
        rel = path.start_with?(m[:root]) ? path.delete_prefix(m[:root]) : path
        parts = rel.split("/").reject(&:empty?)
        (0..parts.size).map { |n| File.join(m[:point], *parts.first(n)) }
      end
    end

    def v2_limit(dir)
      quota, period = File.read(File.join(dir, "cpu.max")).split
      return nil if quota.nil? || quota == "max"

      Integer(quota, 10).to_f / Integer(period, 10)
    rescue SystemCallError, ArgumentError, TypeError
      nil
    end

    def v1_limit(dir)
      quota = Integer(File.read(File.join(dir, "cpu.cfs_quota_us")).strip, 10)
      return nil unless quota.positive?

      quota.to_f / Integer(File.read(File.join(dir, "cpu.cfs_period_us")).strip, 10)
    rescue SystemCallError, ArgumentError, TypeError
      nil
    end
  end
end
