# frozen_string_literal: true

require_relative "../test_helper"
require "json"

# A listener's PROXY protocol flag survives how the socket reaches the server: inherited from systemd
# (the config file's listen entry names its address), and handed to the new image by a HUP re-exec
# (BLACKBUCK_LISTEN_FDS "fd:o:p", "fd:i:p"), for inherited sockets and for ones the server bound.
class ProxyProtocolReexecTest < ServerTest
  GET_ENV = "GET /env HTTP/1.1\r\nHost: a\r\n\r\n"

  # REMOTE_ADDR of GET /env on a new connection that first sends header (nil: no answer at all).
  def remote_addr(io, header = "")
    io.write(header + GET_ENV)
    res = read_response(io, timeout: 5)
    res && (res.status == 200 ? JSON.parse(res.body)["REMOTE_ADDR"] : "answered #{res.status}")
  ensure
    io.close
  end

  def assert_flags(proxied, plain, why)
    assert_equal "192.0.2.61", remote_addr(proxied.call, "PROXY TCP4 192.0.2.61 127.0.0.1 1000 80\r\n"), why
    assert_nil remote_addr(proxied.call), "#{why}: no header, no answer"
    assert_equal "127.0.0.1", remote_addr(plain.call), "#{why}: the other listener is plain HTTP"
  end

  def hup_and_wait(log, generations)
    old = log.call.scan(/old worker \(pid \d+\) exited/).size
    yield
    wait_for(60) { log.call.scan(/old worker \(pid \d+\) exited/).size > old }
    wait_for(10) { log.call.scan(/worker \d+ \(pid \d+\) ready/).size >= generations }
  end

  def test_inherited_from_systemd_flagged_by_the_config_and_kept_across_hup
    proxied = TCPServer.new("127.0.0.1", 0)
    plain = TCPServer.new("127.0.0.1", 0)
    @dir = Dir.mktmpdir("bb-test")
    File.write("#{@dir}/blackbuck.rb", %(listen "127.0.0.1:#{proxied.addr[1]}", proxy_protocol: true\n))
    @log = "#{@dir}/log"
    script = "LISTEN_PID=$$ LISTEN_FDS=2 exec #{RbConfig.ruby} #{EXE} -w 1 -c #{@dir}/blackbuck.rb #{APPS}/kitchen.ru"
    @pid = Process.spawn("sh", "-c", script, 3 => proxied, 4 => plain, out: @log, err: %i[child out], pgroup: true)
    log = -> { File.read(@log) }
    wait_for(20) { log.call.include?("ready") }
    assert_includes log.call, "listening on http://127.0.0.1:#{proxied.addr[1]} (inherited) (PROXY protocol)"
    assert_includes log.call, "listening on http://127.0.0.1:#{plain.addr[1]} (inherited)\n"
    to_proxied = -> { TCPSocket.new("127.0.0.1", proxied.addr[1]) }
    to_plain = -> { TCPSocket.new("127.0.0.1", plain.addr[1]) }
    assert_flags(to_proxied, to_plain, "inherited")

    hup_and_wait(log, 2) { Process.kill(:HUP, @pid) }
    assert_flags(to_proxied, to_plain, "after a HUP re-exec")
  end

  def test_bound_listeners_keep_their_flag_across_hup
    dir = Dir.mktmpdir("bb-test")
    File.write("#{dir}/blackbuck.rb", <<~RUBY)
      listen "127.0.0.1:0", proxy_protocol: true
      listen "unix:#{dir}/plain.sock"
    RUBY
    server = start_server(["-c", "#{dir}/blackbuck.rb"], app: "kitchen.ru", dir: dir)
    assert_flags(-> { server.tcp }, -> { server.unix }, "bound")
    hup_and_wait(-> { server.log }, 2) { server.signal(:HUP) }
    assert_equal 2, server.log.scan(%r{listening on http://127\.0\.0\.1:#{server.tcp_port} \(PROXY protocol\)}).size
    assert_flags(-> { server.tcp }, -> { server.unix }, "after a HUP re-exec")
  end

  def teardown
    if @pid
      begin
        Process.kill(:TERM, @pid)
        Timeout.timeout(15) { Process.wait(@pid) }
      rescue Timeout::Error
        Process.kill(:KILL, -@pid)
        Process.wait(@pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
      warn "\n--- server log (#{name}) ---\n#{File.read(@log)}--- end ---" if !passed? && File.exist?(@log)
      FileUtils.rm_rf(@dir)
    end
    super
  end
end
