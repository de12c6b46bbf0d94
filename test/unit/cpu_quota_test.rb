# frozen_string_literal: true

require "minitest/autorun"
require "tmpdir"
require "fileutils"
require_relative "../../lib/blackbuck/cpu_quota"

# CpuQuota reads /proc/self/cgroup and /proc/self/mountinfo, then the quota files of the
# process's cgroup and its ancestors. Here both are fakes in a tmpdir.
class CpuQuotaTest < Minitest::Test
  def with_fake(cgroup:, mounts:)
    Dir.mktmpdir do |d|
      FileUtils.mkdir_p("#{d}/proc")
      File.write("#{d}/proc/cgroup", cgroup)
      File.write("#{d}/proc/mountinfo", mounts.map { |m| m.gsub("ROOT", d) }.join("\n"))
      yield d
    end
  end

  def write(path, text)
    FileUtils.mkdir_p(File.dirname(path))
    File.write(path, text)
  end

  V2_MOUNT = "30 22 0:27 / ROOT/cg rw,nosuid - cgroup2 cgroup2 rw"
  V1_MOUNT = "31 30 0:28 / ROOT/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct"

  def test_v2_cpu_max_of_the_cgroup_and_its_ancestors
    with_fake(cgroup: "0::/kubepods/pod1/ctr\n", mounts: [V2_MOUNT]) do |d|
      write("#{d}/cg/cpu.max", "max 100000\n")
      write("#{d}/cg/kubepods/pod1/cpu.max", "250000 100000\n") # the pod: 2.5 CPUs
      write("#{d}/cg/kubepods/pod1/ctr/cpu.max", "max 100000\n")
      assert_in_delta 2.5, Blackbuck::CpuQuota.cpus(proc_dir: "#{d}/proc")
      write("#{d}/cg/kubepods/pod1/ctr/cpu.max", "50000 100000\n") # the container: less
      assert_in_delta 0.5, Blackbuck::CpuQuota.cpus(proc_dir: "#{d}/proc")
    end
  end

  def test_v1_cfs_quota_and_no_quota
    with_fake(cgroup: "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n", mounts: [V1_MOUNT]) do |d|
      write("#{d}/cpu/docker/abc/cpu.cfs_quota_us", "-1\n")
      write("#{d}/cpu/docker/abc/cpu.cfs_period_us", "100000\n")
      assert_nil Blackbuck::CpuQuota.cpus(proc_dir: "#{d}/proc"), "-1 is no quota"
      write("#{d}/cpu/docker/abc/cpu.cfs_quota_us", "150000\n")
      assert_in_delta 1.5, Blackbuck::CpuQuota.cpus(proc_dir: "#{d}/proc")
    end
  end

  def test_a_container_whose_cgroup_is_the_mount_root
    # in a cgroup namespace the process's path is "/" and the mount's root is "/" too
    with_fake(cgroup: "0::/\n", mounts: [V2_MOUNT]) do |d|
      write("#{d}/cg/cpu.max", "200000 100000\n")
      assert_in_delta 2.0, Blackbuck::CpuQuota.cpus(proc_dir: "#{d}/proc")
    end
  end

  def test_nothing_readable_is_no_quota
    assert_nil Blackbuck::CpuQuota.cpus(proc_dir: "/nonexistent")
    with_fake(cgroup: "0::/a\n", mounts: [V2_MOUNT]) { |d| assert_nil Blackbuck::CpuQuota.cpus(proc_dir: "#{d}/proc") }
  end
end
