# frozen_string_literal: true

# Reforking under keep-alive load: does a refork cost clients anything? Blackbuck runs an app with
# refork_after set so that three reforks happen about --gap seconds apart, while blackbuck-load keeps
# --connections keep-alive connections busy over the UNIX socket (or, with --nginx, through nginx
# with upstream keep-alive). Reports the load tool's failed requests and reconnects, and for each
# refork the server's request rate in the --window seconds after it against the --window before
# (the issue's target: >= 0.9x), from /status totals sampled every SAMPLE_SECONDS.
#
#   ruby bench/refork.rb [--nginx] [--workers 4] [--gap 15] [--window 5] [--app bench/apps/hello.ru]
#
# The refork counts come from a first short run without reforking (the requests one worker serves
# in --gap seconds), so the reforks land at about the same times on a fast or a slow machine.
require "json"
require "optparse"
require "socket"
require "tmpdir"
require "fileutils"

module ReforkBench
  ROOT = File.expand_path("..", __dir__)
  LOAD = File.join(ROOT, "loadgen", "blackbuck-load")
  NGINX = "/usr/sbin/nginx"
  SAMPLE_SECONDS = 0.25
  REFORKS = 3

  module_function

  def main(argv)
    opts = { workers: 4, gap: 15.0, window: 5.0, connections: 32, nginx: false, app: File.join(ROOT, "bench/apps/hello.ru") }
    OptionParser.new do |o|
      o.banner = "usage: ruby bench/refork.rb [options]"
      o.on("--workers N", Integer) { |v| opts[:workers] = v }
      o.on("--gap SECONDS", Float, "seconds between reforks (default 15)") { |v| opts[:gap] = v }
      o.on("--window SECONDS", Float, "seconds compared before and after each refork (default 5)") { |v| opts[:window] = v }
      o.on("--connections N", Integer, "keep-alive connections (default 32)") { |v| opts[:connections] = v }
      o.on("--nginx", "through nginx with upstream keep-alive") { opts[:nginx] = true }
      o.on("--app PATH", "rackup file (default bench/apps/hello.ru)") { |v| opts[:app] = File.expand_path(v) }
      o.on("--out FILE", "also write the report (Markdown) here") { |v| opts[:out] = v }
    end.parse!(argv)
    abort "bench/refork.rb: #{LOAD} is not built (make -C loadgen)" unless File.executable?(LOAD)
    abort "bench/refork.rb: nginx is not installed" if opts[:nginx] && !File.executable?(NGINX)

    Dir.mktmpdir("bb-refork") do |dir|
      per_worker = measure_rate(dir, opts)
      count = [(per_worker * opts[:gap]).round, 1].max
      report = run(dir, opts, Array.new(REFORKS, count))
      text = render(report, opts, count)
      puts text
      File.write(opts[:out], text) if opts[:out]
      exit(report[:pass] ? 0 : 1)
    end
  end

  # Requests one worker serves per second here, from a 3 s run without reforking.
  def measure_rate(dir, opts)
    with_server(dir, opts, nil) do |target, status|
      load_run(target, 3, opts[:connections], "#{dir}/warm.json")
      status.call["totals"]["requests"].to_f / 3 / opts[:workers]
    end
  end

  def run(dir, opts, counts)
    with_server(dir, opts, counts) do |target, status|
      samples = []
      seconds = opts[:gap] * (REFORKS + 1) + opts[:window]
      sampler = Thread.new do
        t0 = now
        while now - t0 < seconds + 1
          s = status.call
          samples << [now - t0, s["totals"]["requests"], s.dig("refork", "generation")]
          sleep SAMPLE_SECONDS
        end
      end
      load = load_run(target, seconds, opts[:connections], "#{dir}/load.json")
      sampler.join
      log = "#{dir}/nginx/error.log"
      proxy_errors = File.exist?(log) ? File.readlines(log).grep(/\[(error|crit|alert)\]/) : []
      analyse(load, samples, opts[:window]).tap do |r|
        r[:proxy_errors] = proxy_errors.size
        r[:pass] &&= proxy_errors.empty?
        proxy_errors.first(5).each { |l| warn "nginx: #{l}" }
      end
    end
  end

  def analyse(load, samples, window)
    reforks = samples.each_cons(2).select { |a, b| b[2] > a[2] }.map { |_, b| b[0] }
    ratios = reforks.map do |t|
      before = rate(samples, t - window, t)
      after = rate(samples, t, t + window)
      { at: t.round(1), before: before.round, after: after.round, ratio: before.positive? ? (after / before).round(3) : nil }
    end
    errors = load["errors"].values.sum
    non200 = load["status_codes"].reject { |code, _| code == "200" }.values.sum
    pass = reforks.size == REFORKS && errors.zero? && non200.zero? && ratios.all? { |r| r[:ratio] && r[:ratio] >= 0.9 }
    { reforks: ratios, errors: load["errors"], non200: non200, requests: load["requests"], reconnects: load["reconnects"],
      pass: pass }
  end

  # Requests per second between t1 and t2 by the server's own count (samples outside are not used).
  def rate(samples, t1, t2)
    inside = samples.select { |t, _, _| t >= t1 && t <= t2 }
    return 0.0 if inside.size < 2

    (inside.last[1] - inside.first[1]).to_f / (inside.last[0] - inside.first[0])
  end

  def render(r, opts, count)
    via = opts[:nginx] ? "nginx (upstream keepalive 32) -> UNIX socket" : "UNIX socket"
    lines = ["## Reforking under keep-alive load (#{Time.now.utc.strftime('%Y-%m-%d')})", "",
             "#{opts[:workers]} workers, `refork_after #{([count] * REFORKS).join(', ')}`, #{opts[:connections]} keep-alive " \
             "connections over #{via}, app `#{File.basename(opts[:app])}`.", "",
             "| refork at | req/s #{opts[:window].round}s before | req/s #{opts[:window].round}s after | after / before |",
             "|--:|--:|--:|--:|"]
    r[:reforks].each { |x| lines << "| #{x[:at]} s | #{x[:before]} | #{x[:after]} | #{x[:ratio]} |" }
    lines << "" << "Requests: #{r[:requests]}; failed: #{r[:errors].values.sum} (#{r[:errors].map { |k, v| "#{k} #{v}" }.join(', ')}); " \
                    "non-200: #{r[:non200]}; reconnects: #{r[:reconnects]}" \
                    "#{"; nginx error-log lines: #{r[:proxy_errors]}" if opts[:nginx]}."
    lines << "" << "Target (0 failed, 0 non-200#{', 0 nginx errors' if opts[:nginx]}, #{REFORKS} reforks, every after/before " \
                    ">= 0.9): #{r[:pass] ? 'met' : 'NOT met'}."
    lines.join("\n")
  end

  def with_server(dir, opts, counts)
    sock = "#{dir}/app.sock"
    stats = "#{dir}/status.sock"
    conf = "#{dir}/blackbuck.rb"
    File.write(conf, <<~RB)
      workers #{opts[:workers]}
      listen "unix:#{sock}"
      stats_listen "unix:#{stats}"
      environment "production"
      #{"refork_after #{counts.join(', ')}" if counts}
    RB
    log = "#{dir}/server-#{counts ? 'refork' : 'warm'}.log"
    pid = Process.spawn(RbConfig.ruby, File.join(ROOT, "exe/blackbuck"), "-c", conf, opts[:app], out: log, err: log,
                        pgroup: true)
    nginx = nil
    wait_for { File.read(log).scan(/worker \d+ \(pid \d+\) ready/).size >= opts[:workers] }
    target = ["-P", sock, "http://localhost/"]
    if opts[:nginx]
      nginx = start_nginx(dir, sock)
      target = ["http://127.0.0.1:#{nginx[1]}/"]
    end
    yield target, -> { JSON.parse(status_get(stats)) }
  ensure
    stop(nginx[0]) if nginx
    stop(pid) if pid
    File.foreach(log) { |l| puts "  #{l}" if l.match?(/refork:|mold|WARN|ERROR/) } if counts && log && File.exist?(log)
  end

  def load_run(target, seconds, connections, json)
    ok = system(LOAD, "-t", "1", "-c", connections.to_s, "-d", "#{(seconds * 1000).round}ms", "--json", json, *target, out: File::NULL)
    raise "blackbuck-load failed" unless ok

    JSON.parse(File.read(json))
  end

  def start_nginx(dir, sock)
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    FileUtils.mkdir_p("#{dir}/nginx")
    File.write("#{dir}/nginx/nginx.conf", <<~CONF)
      #{'user root;' if Process.uid.zero?}
      worker_processes 1;
      daemon off;
      pid #{dir}/nginx/nginx.pid;
      error_log #{dir}/nginx/error.log;
      events { worker_connections 1024; }
      http {
        access_log off;
        client_body_temp_path #{dir}/nginx/body; proxy_temp_path #{dir}/nginx/proxy;
        fastcgi_temp_path #{dir}/nginx/fcgi; uwsgi_temp_path #{dir}/nginx/uwsgi; scgi_temp_path #{dir}/nginx/scgi;
        upstream app { server unix:#{sock} fail_timeout=0; keepalive 32; }
        server {
          listen 127.0.0.1:#{port};
          location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
        }
      }
    CONF
    pid = Process.spawn(NGINX, "-p", "#{dir}/nginx", "-c", "#{dir}/nginx/nginx.conf", out: File::NULL, err: File::NULL,
                                                                                      pgroup: true)
    wait_for do
      TCPSocket.new("127.0.0.1", port).close
      true
    rescue Errno::ECONNREFUSED
      false
    end
    [pid, port]
  end

  def status_get(path)
    UNIXSocket.open(path) do |io|
      io.write("GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      io.read.split("\r\n\r\n", 2)[1]
    end
  end

  def stop(pid)
    Process.kill(:TERM, pid)
    Process.wait(pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  def wait_for(timeout = 60)
    deadline = now + timeout
    sleep 0.05 until yield || now > deadline
    raise "not ready in #{timeout}s" if now > deadline
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

ReforkBench.main(ARGV) if $PROGRAM_NAME == __FILE__
