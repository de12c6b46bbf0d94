# frozen_string_literal: true

# Instructions per request of one worker, counted by valgrind (cachegrind): a figure that, unlike
# req/s or CPU time on this shared 2-core VM, does not move between runs, so two versions of the
# server can be compared to the percent. Hello world over a UNIX socket, one worker.
#
#   ruby bench/instructions.rb [--mode keepalive|close] [--requests 500,2500] [REF ...] [-- SERVER FLAGS]
#
# Each REF (default: HEAD) is checked out into a temporary git worktree and built there with the
# parser's scalar scanners (valgrind does not run SSE4.2's string instructions). Per REF, two
# servers serve N1 and N2 requests; the difference of the worker's instructions over N2 - N1 is
# the figure (start-up and exit cancel out). The GC is given room for the whole run, so no
# collection lands in one run and not the other. The worker's pthread (the hand-off watcher)
# counts too; its wake-ups are per second of wall time, so under valgrind's slowdown they weigh
# more per request than they do at full speed (run once with `-- --handoff-after 0` to see them).
require "fileutils"
require "optparse"
require "socket"
require "tmpdir"

module Instructions
  ROOT = File.expand_path("..", __dir__)
  APP = <<~RU
    BODY = "hello world\\n"
    HEADERS = { "content-type" => "text/plain", "content-length" => BODY.bytesize.to_s }.freeze
    run lambda { |_env| [200, HEADERS.dup, [BODY]] }
  RU
  GC_ROOM = { "RUBY_GC_HEAP_INIT_SLOTS" => "1000000", "RUBY_GC_MALLOC_LIMIT" => "200000000",
              "RUBY_GC_MALLOC_LIMIT_MAX" => "400000000", "RUBY_GC_OLDMALLOC_LIMIT" => "200000000" }.freeze
  SIMD_GUARD = "#if defined(__x86_64__) || defined(__i386__)"
  CONNECTIONS = 4 # keep-alive clients, each sending its next request once all have their answer
  READY_SECONDS = 120

  module_function

  def main(argv)
    opts = { mode: "keepalive", requests: [500, 2500] }
    flags = (i = argv.index("--")) ? argv.slice!(i..)[1..] : []
    OptionParser.new do |o|
      o.banner = "usage: ruby bench/instructions.rb [options] [REF ...] [-- server flags]"
      o.on("--mode MODE", %w[keepalive close], "keepalive (default) or close") { |v| opts[:mode] = v }
      o.on("--requests N1,N2", Array, "the two request counts (default 500,2500)") do |v|
        opts[:requests] = v.map { |n| Integer(n) }
      end
    end.parse!(argv)
    n1, n2 = opts[:requests]
    abort "--requests: two counts, the second larger" unless opts[:requests].size == 2 && n1.positive? && n2 > n1
    abort "valgrind is not installed (apt-get install valgrind)" unless system("valgrind --version > /dev/null 2>&1")
    refs = argv.empty? ? ["HEAD"] : argv
    Dir.mktmpdir("bb-instructions") do |tmp|
      File.write(app = File.join(tmp, "hello.ru"), APP)
      refs.each do |ref|
        tree = build(ref, tmp)
        counts = [n1, n2].map { |n| worker_instructions(tree, app, flags, n, opts[:mode], tmp) }
        per = (counts[1] - counts[0]).fdiv(n2 - n1)
        puts format("%-12s %-9s %s  %8.0f instructions/request", ref, opts[:mode], flags.join(" "), per)
      end
    end
  end

  def build(ref, tmp)
    tree = File.join(tmp, ref.tr("/", "_"))
    run!("git", "-C", ROOT, "worktree", "add", "--detach", "-f", tree, ref)
    at_exit { system("git", "-C", ROOT, "worktree", "remove", "--force", tree, out: File::NULL, err: File::NULL) }
    http = File.join(tree, "ext/blackbuck/bb_http.c")
    src = File.read(http)
    abort "#{ref}: #{http} has no #{SIMD_GUARD} line to turn off" unless src.include?(SIMD_GUARD)
    File.write(http, src.sub(SIMD_GUARD, "#if 0 /* bench/instructions.rb: scalar scanners for valgrind */"))
    run!("bundle", "exec", "rake", "compile", chdir: tree)
    tree
  end

  def worker_instructions(tree, app, flags, count, mode, tmp)
    out = File.join(tmp, "cg")
    FileUtils.rm_rf(out)
    FileUtils.mkdir_p(out)
    sock = File.join(tmp, "s.sock")
    log = File.join(tmp, "server.log")
    cmd = ["bundle", "exec", "valgrind", "--tool=cachegrind", "--cache-sim=no", "--trace-children=yes",
           "--cachegrind-out-file=#{out}/%p.out", "ruby", "-Ilib", "exe/blackbuck", "-w", "1", "-E", "none",
           "--max-keepalive-requests", "0", *flags, "-l", "unix:#{sock}", app]
    pid = spawn(GC_ROOM, *cmd, chdir: tree, out: log, err: log, pgroup: true)
    worker = wait_worker(log, pid)
    mode == "close" ? close_requests(sock, count) : keepalive_requests(sock, count)
    Process.kill(:TERM, pid)
    Process.wait(pid)
    summary = File.foreach(File.join(out, "#{worker}.out")).find { |l| l.start_with?("summary:") }
    Integer(summary.split[1])
  ensure
    if pid
      begin
        Process.kill(:KILL, -pid)
        Process.wait(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
    end
  end

  def wait_worker(log, pid)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + READY_SECONDS
    loop do
      pid_s = File.exist?(log) && File.read(log)[/worker 0 \(pid (\d+)\) ready/, 1]
      return Integer(pid_s) if pid_s
      abort "server exited before its worker was ready; see its log" if Process.waitpid(pid, Process::WNOHANG)
      abort "no worker ready in #{READY_SECONDS} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.2
    end
  end

  REQUEST = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
  BODY = "hello world\n"

  def keepalive_requests(sock, count)
    clients = Array.new(CONNECTIONS) { UNIXSocket.new(sock) }
    (count / CONNECTIONS).times do
      clients.each { |c| c.write(REQUEST) }
      clients.each { |c| read_answer(c) }
    end
  ensure
    clients&.each(&:close)
  end

  def close_requests(sock, count)
    count.times do
      c = UNIXSocket.new(sock)
      c.write("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      abort "unexpected answer" unless c.read.end_with?(BODY)
      c.close
    end
  end

  def read_answer(io)
    buf = +""
    buf << io.readpartial(4096) until buf.end_with?(BODY)
  end

  def run!(*cmd, chdir: ROOT)
    system(*cmd, chdir: chdir, out: File::NULL, err: File::NULL) or abort "failed: #{cmd.join(' ')}"
  end
end

Instructions.main(ARGV) if $PROGRAM_NAME == __FILE__
