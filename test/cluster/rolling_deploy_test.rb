# frozen_string_literal: true

require_relative "../test_helper"
require "net/http"
require "open3"

# A rolling deploy across three hosts behind HAProxy, under continuous load: each host is a Linux
# network namespace with its own address on a bridge the test makes; HAProxy in front checks
# GET /ready on each host's status listener. Host by host the code is replaced (TERM with
# shutdown_delay, the new version started, /ready awaited), then every host is HUP re-executed
# with newer code. No request may fail, and every answer must come from a live version.
# Everything the test makes (namespaces, links, processes) is removed by name it chose / by pid.
# Each step waits for the state the next one needs (HAProxy's own view of a host, through its
# runtime API; answers the load has had), never for a time: a loaded machine makes any time too short.
class RollingDeployTest < ServerTest
  HOSTS = 3
  APP_PORT = 8080
  STATS_PORT = 9393
  LOAD_THREADS = 4
  ANSWERS = 50 # answers the load must get at a step (e.g. from the first version before the roll)

  def setup
    skip "needs root (network namespaces)" unless Process.uid.zero?
    skip "haproxy is not installed (bin/setup installs it)" unless File.executable?("/usr/sbin/haproxy")
    @id = "#{Process.pid % 10_000}#{rand(100)}"
    @net = "10.213.#{rand(1..250)}"
    @dir = Dir.mktmpdir("bb-cluster")
    @made = [] # [kind, name] to undo, newest first
    @hosts = {}
    begin
      make_network
    rescue RuntimeError => e
      teardown_network
      skip "cannot make network namespaces here: #{e.message}"
    end
  end

  def teardown
    @load&.each(&:kill)
    @haproxy&.stop
    (@hosts || {}).each_value { |h| h[:proc]&.stop }
    unless passed?
      (@hosts || {}).each { |name, h| warn "\n--- #{name} ---\n#{h[:proc]&.log}" }
      warn "\n--- haproxy ---\n#{@haproxy&.log}"
    end
    teardown_network
    FileUtils.rm_rf(@dir) if @dir
    super
  end

  def ip(*args)
    out, status = Open3.capture2e("ip", *args)
    raise "ip #{args.join(' ')}: #{out.strip}" unless status.success?

    out
  end

  def ns(n) = "bb#{@id}h#{n}"
  def addr(n) = "#{@net}.#{10 + n}"

  def make_network
    bridge = "bb#{@id}br"
    ip("link", "add", bridge, "type", "bridge")
    @made << [:link, bridge]
    ip("addr", "add", "#{@net}.1/24", "dev", bridge)
    ip("link", "set", bridge, "up")
    (1..HOSTS).each do |n|
      ip("netns", "add", ns(n))
      @made << [:netns, ns(n)]
      outer = "bb#{@id}v#{n}"
      inner = "bb#{@id}p#{n}"
      ip("link", "add", outer, "type", "veth", "peer", "name", inner)
      @made << [:link, outer]
      ip("link", "set", inner, "netns", ns(n))
      ip("link", "set", outer, "master", bridge, "up")
      ip("netns", "exec", ns(n), "ip", "addr", "add", "#{addr(n)}/24", "dev", inner)
      ip("netns", "exec", ns(n), "ip", "link", "set", inner, "up")
      ip("netns", "exec", ns(n), "ip", "link", "set", "lo", "up")
    end
  end

  def teardown_network
    (@made || []).reverse_each do |kind, name|
      kind == :netns ? system("ip", "netns", "del", name, err: File::NULL) : system("ip", "link", "del", name, err: File::NULL)
    end
    @made = []
  end

  # Blackbuck on host n, serving whatever version its file says when it boots.
  def start_host(n, version)
    File.write("#{@dir}/h#{n}.version", version)
    log = "#{@dir}/h#{n}-#{version}.log"
    proc = ChildProcess.new(["ip", "netns", "exec", ns(n), RbConfig.ruby, EXE, "-w", "2",
                             "-l", "#{addr(n)}:#{APP_PORT}", "--stats-listen", "#{addr(n)}:#{STATS_PORT}",
                             "--shutdown-delay", "1.5", "--graceful-timeout", "10",
                             File.join(APPS, "versioned.ru")],
                            log_path: log, env: { "BB_VERSION_FILE" => "#{@dir}/h#{n}.version", "BB_HOST_NAME" => "h#{n}" })
    @hosts["h#{n}"] = { proc: proc }
    wait_for(30) do
      flunk("h#{n} exited: #{proc.log}") if proc.exited?
      proc.log.scan(/worker \d \(pid \d+\) ready/).size >= 2 && ready?(n)
    end
    proc
  end

  def ready?(n)
    Net::HTTP.start(addr(n), STATS_PORT, open_timeout: 1, read_timeout: 1) { |h| h.get("/ready").code == "200" }
  rescue SystemCallError, Net::OpenTimeout, Net::ReadTimeout, IOError
    false
  end

  def start_haproxy
    @port = free_port
    # timeout check: without it a check gets `inter` (250 ms) for its answer, and fall 1 takes a
    # healthy host out whenever a busy machine answers /ready later than that; a host that says 503
    # (TERM) or refuses the connection (stopped) still goes out at its first check.
    File.write("#{@dir}/haproxy.cfg", <<~CFG)
      global
        maxconn 512
        stats socket #{haproxy_socket} mode 600 level admin
      defaults
        mode http
        timeout connect 2s
        timeout client 30s
        timeout server 30s
        timeout check 5s
        retries 3
        option redispatch
        retry-on conn-failure empty-response response-timeout
      frontend fe
        bind 127.0.0.1:#{@port}
        default_backend app
      backend app
        balance roundrobin
        option httpchk GET /ready
        http-check expect status 200
        default-server inter 250ms fall 1 rise 1 check port #{STATS_PORT}
      #{(1..HOSTS).map { |n| "  server h#{n} #{addr(n)}:#{APP_PORT}" }.join("\n")}
    CFG
    @haproxy = ChildProcess.new(["/usr/sbin/haproxy", "-db", "-f", "#{@dir}/haproxy.cfg"], log_path: "#{@dir}/haproxy.log")
    wait_for(30) do
      flunk("haproxy exited: #{@haproxy.log}") if @haproxy.exited?
      answers = Array.new(9) { get_through_haproxy }
      answers.map { |a| a.to_s.split.last }.uniq.size == HOSTS
    end
  end

  def haproxy_socket = "#{@dir}/haproxy.sock"

  # HAProxy's view of host n (its runtime API, `show servers state`): in service, its checks passing.
  def haproxy_up?(n)
    out = UNIXSocket.open(haproxy_socket) do |s|
      s.write("show servers state app\n")
      s.read
    end
    names = out.lines.find { |l| l.start_with?("# ") }&.delete_prefix("# ")&.split
    server = out.lines.map { |l| names.to_a.zip(l.split).to_h }.find { |f| f["srv_name"] == "h#{n}" }
    raise "no h#{n} in HAProxy's servers state:\n#{out}" unless server

    server["srv_op_state"] == "2" # SRV_ST_RUNNING
  end

  # Until HAProxy sends host n requests again.
  def wait_in_service(n) = wait_for(30, "HAProxy taking h#{n} back") { haproxy_up?(n) }

  # Until the load has had `more` answers more (failures count too: they are what the test looks for).
  def wait_answers(more = ANSWERS)
    goal = @results.size + more
    wait_for(60, "#{more} more answers to the load") { @results.size >= goal }
  end

  def get_through_haproxy
    Net::HTTP.start("127.0.0.1", @port, open_timeout: 2, read_timeout: 5) { |h| h.get("/").body }
  rescue StandardError
    nil
  end

  # Threads with keep-alive clients; every answer is recorded, every failure kept whole.
  def start_load
    @results = Queue.new
    @stop = false
    @load = Array.new(LOAD_THREADS) do
      Thread.new do
        until @stop
          begin
            Net::HTTP.start("127.0.0.1", @port, open_timeout: 5, read_timeout: 15) do |http|
              200.times do
                break if @stop

                res = http.get("/")
                @results << (res.code == "200" ? [:ok, res.body.split.first] : [:fail, "#{res.code} #{res.body[0, 100]}"])
              end
            end
          rescue StandardError => e
            @results << [:fail, "#{e.class}: #{e.message}"]
          end
        end
      end
    end
  end

  def test_rolling_replace_then_hup_on_every_host_drops_nothing
    (1..HOSTS).each { |n| start_host(n, "v1") }
    start_haproxy
    start_load
    wait_answers # from the first version
    (1..HOSTS).each do |n| # replace the code host by host
      old = @hosts["h#{n}"][:proc]
      old.signal(:TERM)
      wait_for(30, "HAProxy taking h#{n} out") { !haproxy_up?(n) } # /ready says 503 (shutdown_delay)
      assert old.wait_exit(20)&.success?, "h#{n} v1 stops cleanly: #{old.log}"
      assert_match(/TERM: not ready/, old.log)
      start_host(n, "v2")
      wait_in_service(n) # HAProxy's health check (every 250 ms, rise 1) takes it back before the next goes
    end
    (1..HOSTS).each do |n| # then a HUP re-exec with newer code on every host
      File.write("#{@dir}/h#{n}.version", "v3")
      host = @hosts["h#{n}"][:proc]
      host.signal(:HUP)
      wait_for(60) { host.log.include?("new workers ready") }
      wait_for(30) { host.log.scan(/old worker \(pid \d+\) exited/).size >= 2 }
      wait_in_service(n)
    end
    wait_answers # from the newest code only
    @stop = true
    @load.each { |t| t.join(20) }
    results = []
    results << @results.pop until @results.empty?
    failures = results.select { |kind, _| kind == :fail }
    versions = results.reject { |kind, _| kind == :fail }.map(&:last).tally
    assert_empty failures, "failed requests during the roll (#{results.size} in all): #{failures.first(5).inspect}"
    assert_operator results.size, :>, 500, "the load ran throughout"
    assert_empty versions.keys - %w[v1 v2 v3], "answers only from live versions: #{versions}"
    assert_equal %w[v1 v2 v3], versions.keys.sort, "every version served during the roll: #{versions}"
    final = Array.new(9) { get_through_haproxy.to_s.split.first }
    assert_equal ["v3"], final.uniq, "after the roll every host serves the newest code"
    puts "\n  rolling deploy: #{results.size} requests, 0 failed, by version #{versions}"
  end
end
