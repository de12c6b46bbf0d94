# frozen_string_literal: true

require "etc"

module BlackbuckBench
  # Reads a server's process tree from /proc: CPU time (utime + stime of every live process in
  # the tree) and memory of its worker processes. No sampling thread: the harness reads the tree
  # right before and right after each measurement, so the CPU delta covers exactly that window.
  module Procfs
    CLK_TCK = Etc.sysconf(Etc::SC_CLK_TCK) # ticks per second of utime/stime in /proc/PID/stat

    Proc_ = Struct.new(:pid, :ppid, :ticks, :cmdline, keyword_init: true)

    module_function

    # Every process whose ancestry leads to root_pid (root included).
    def tree(root_pid)
      all = Dir.children("/proc").grep(/\A\d+\z/).filter_map { |d| stat(d.to_i) }
      by_parent = all.group_by(&:ppid)
      out = []
      queue = all.select { |p| p.pid == root_pid }
      until queue.empty?
        p = queue.shift
        out << p
        queue.concat(by_parent.fetch(p.pid, []))
      end
      out
    end

    def stat(pid)
      raw = File.read("/proc/#{pid}/stat")
      # comm (field 2) may hold spaces and parens: split after the last ')'
      fields = raw[(raw.rindex(")") + 2)..].split(" ")
      # fields[0] is state (field 3); utime/stime are fields 14/15 => index 11/12
      cmd = File.read("/proc/#{pid}/cmdline").tr("\0", " ").strip
      Proc_.new(pid: pid, ppid: fields[1].to_i, ticks: fields[11].to_i + fields[12].to_i, cmdline: cmd)
    rescue Errno::ENOENT, Errno::ESRCH, Errno::EACCES
      nil
    end

    # CPU seconds used so far by the live processes of the tree.
    def cpu_seconds(root_pid)
      tree(root_pid).sum(&:ticks).to_f / CLK_TCK
    end

    # { rss_kb:, pss_kb: } of one process (Pss shares copy-on-write pages fairly between forks).
    def memory_kb(pid)
      rss = File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+)/, 1].to_i
      pss = begin
        File.read("/proc/#{pid}/smaps_rollup")[/^Pss:\s+(\d+)/, 1].to_i
      rescue Errno::ENOENT, Errno::EACCES
        nil
      end
      { rss_kb: rss, pss_kb: pss }
    rescue Errno::ENOENT, Errno::ESRCH
      nil
    end

    # Workers of a tree: processes whose cmdline matches worker_re (a recipe's process title),
    # or, when nothing matches, every process but the root.
    def workers(root_pid, worker_re)
      procs = tree(root_pid)
      matched = worker_re ? procs.select { |p| p.cmdline.match?(worker_re) } : []
      matched.empty? ? procs.reject { |p| p.pid == root_pid } : matched
    end

    def mean(values)
      values = values.compact
      values.empty? ? nil : (values.sum.to_f / values.size).round
    end

    # Mean RSS and PSS per worker, and the number of workers seen.
    def worker_memory(root_pid, worker_re)
      mems = workers(root_pid, worker_re).filter_map { |p| memory_kb(p.pid) }
      { workers_seen: mems.size, rss_kb_per_worker: mean(mems.map { |m| m[:rss_kb] }),
        pss_kb_per_worker: mean(mems.map { |m| m[:pss_kb] }) }
    end
  end
end
