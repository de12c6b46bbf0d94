# frozen_string_literal: true

require_relative "../test_helper"
require "etc"

# HUP applies the config file's listen list, unix_socket_mode and unix_socket_group (what a user
# tries after a 502: edit config/blackbuck.rb, `systemctl reload`): added addresses are bound,
# dropped ones closed, kept sockets keep serving (same port, same file) with the new mode, and each
# change is logged. What cannot be applied is a warning, and every previous listener keeps serving.
class HupListenersTest < ServerTest
  def setup
    @dir = Dir.mktmpdir("bb-test")
    @config = "#{@dir}/blackbuck.rb"
  end

  def write_config(*listen, mode: nil, group: nil, stats: nil)
    lines = listen.map { |a| "listen #{a.inspect}" }
    lines << "stats_listen #{stats.inspect}" if stats
    lines << "unix_socket_mode 0o#{mode.to_s(8)}" if mode
    lines << "unix_socket_group #{group.inspect}" if group
    File.write(@config, lines.join("\n"))
  end

  def start
    start_server(["-c", @config], app: "hello.ru", workers: 2, dir: @dir)
  end

  # The log after the HUP's new workers are ready: the HUP's lines, in order.
  def hup_and_wait(server)
    before = server.log.size
    server.signal(:HUP)
    wait_for(60, "the new image's workers") { server.log[before..].scan(/worker \d+ \(pid \d+\) ready/).size >= 2 }
    server.log[before..]
  end

  def get_over(io)
    request(io, "GET", "/").status
  ensure
    io&.close
  end

  def test_hup_binds_added_addresses_closes_dropped_ones_and_applies_the_socket_mode
    kept = "#{@dir}/kept.sock"
    dropped = "#{@dir}/dropped.sock"
    write_config("unix:#{kept}", "unix:#{dropped}", mode: 0o600)
    server = start
    assert_equal 0o600, File.stat(kept).mode & 0o7777
    pid = server.pid
    port = free_port
    write_config("unix:#{kept}", "127.0.0.1:#{port}", mode: 0o660)
    held = UNIXSocket.new(kept) # a connection open across the reload is served by the old workers
    after = hup_and_wait(server)

    assert_match(%r{HUP: added listener http://127\.0\.0\.1:#{port}$}, after)
    assert_match(/HUP: closed listener unix:#{Regexp.escape(dropped)} \(no longer in the config\)/, after)
    assert_match(/HUP: unix:#{Regexp.escape(kept)} mode 0660 \(was 0600\)/, after)
    assert_match(/listening on unix:#{Regexp.escape(kept)}$/, after)
    refute_match(/listening on unix:#{Regexp.escape(dropped)}/, after, "the log names only current listeners")
    assert_equal 0o660, File.stat(kept).mode & 0o7777
    refute File.exist?(dropped), "the dropped socket's file is removed"
    assert_equal 200, get_over(TCPSocket.new("127.0.0.1", port)), "the added address serves"
    assert_equal 200, get_over(UNIXSocket.new(kept)), "the kept socket serves"
    assert_equal 200, get_over(held), "a connection made before the reload is served"
    assert_equal pid, server.pid
    refute server.exited?
  end

  # nginx's group added to the config after a 502: the kept socket is given to it.
  def test_hup_gives_the_kept_socket_to_a_new_unix_socket_group
    skip "giving a socket to a group needs root" unless Process.uid.zero?
    group = Etc.getgrnam("www-data") rescue skip("no www-data group")
    sock = "#{@dir}/app.sock"
    write_config("unix:#{sock}", mode: 0o660)
    server = start
    assert_equal Process.gid, File.stat(sock).gid
    write_config("unix:#{sock}", mode: 0o660, group: "www-data")
    after = hup_and_wait(server)
    assert_match(/HUP: unix:#{Regexp.escape(sock)} group www-data \(was #{Etc.getgrgid(Process.gid).name}\)/, after)
    assert_equal group.gid, File.stat(sock).gid
    assert_equal 200, get_over(UNIXSocket.new(sock))
  end

  # An added address that cannot be bound (another process has it): a warning, and the server keeps
  # every listener it had, so the reload never leaves it deaf.
  def test_an_address_that_cannot_be_bound_is_a_warning_and_the_old_listeners_stay
    sock = "#{@dir}/app.sock"
    write_config("unix:#{sock}")
    server = start
    taken = TCPServer.new("127.0.0.1", 0)
    port = taken.addr[1]
    write_config("127.0.0.1:#{port}") # moves from the socket to a port someone else holds
    after = hup_and_wait(server)
    assert_match(/WARN HUP: cannot listen on 127\.0\.0\.1:#{port} .*keeping every previous listener \(unix:#{Regexp.escape(sock)}\)/,
                 after)
    assert_equal 200, get_over(UNIXSocket.new(sock))
    refute server.exited?
  ensure
    taken&.close
  end

  # The status listener moves with stats_listen; one that cannot move (its new address is taken)
  # stays where it was, with a warning: the master and its probes survive the reload.
  def test_the_status_listener_moves_and_one_that_cannot_stays
    sock = "#{@dir}/app.sock"
    write_config("unix:#{sock}", stats: "unix:#{@dir}/status1.sock")
    server = start
    write_config("unix:#{sock}", stats: "unix:#{@dir}/status2.sock")
    after = hup_and_wait(server)
    assert_match(/status listening on unix:#{Regexp.escape(@dir)}\/status2\.sock$/, after)
    assert_match(/"workers"/, stats_get("#{@dir}/status2.sock", "/status"))
    taken = UNIXServer.new("#{@dir}/taken.sock")
    write_config("unix:#{sock}", stats: "unix:#{@dir}/taken.sock")
    after = hup_and_wait(server)
    assert_match(/WARN HUP: status listener: cannot listen on unix:#{Regexp.escape(@dir)}\/taken\.sock.*; keeping unix:#{Regexp.escape(@dir)}\/status2\.sock/, after)
    assert_match(/"workers"/, stats_get("#{@dir}/status2.sock", "/status"))
    assert_equal 200, get_over(UNIXSocket.new(sock))
    refute server.exited?
  ensure
    taken&.close
  end

  # Port 0 in the config names the port the kernel picked at boot: a reload keeps it.
  def test_port_zero_keeps_the_port_it_got
    write_config("127.0.0.1:0", "localhost:0")
    server = start
    ports = server.log.scan(%r{listening on (http://\S+)}).flatten
    assert_operator ports.size, :>=, 2, server.log
    after = hup_and_wait(server)
    refute_match(/HUP: (added|closed) listener/, after)
    assert_equal ports, after.scan(%r{listening on (http://\S+)}).flatten, "the same listeners, same ports"
    assert_equal 200, get_over(TCPSocket.new("127.0.0.1", server.tcp_port))
  end
end
