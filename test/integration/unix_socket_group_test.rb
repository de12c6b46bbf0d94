# frozen_string_literal: true

require_relative "../test_helper"
require "etc"
require "net/http"
require "open3"

# unix_socket_group: Debian's nginx, its workers running as www-data, proxies to a Blackbuck
# UNIX socket. Root only (nginx's `user` directive and chown to another group need it).
class UnixSocketGroupTest < ServerTest
  NGINX_USER = "www-data"

  def setup
    skip "needs root (nginx's `user #{NGINX_USER};` and a chown to its group)" unless Process.uid.zero?
    skip "#{NginxProxy::BIN} is not installed (apt-get install nginx)" unless NginxProxy.available?
    begin
      Etc.getpwnam(NGINX_USER)
      @gid = Etc.getgrnam(NGINX_USER).gid
    rescue ArgumentError
      skip "no #{NGINX_USER} user and group"
    end
    # The socket's directory: www-data may pass through it (x) but not list or write it.
    @dir = Dir.mktmpdir("bb-test")
    File.chmod(0o711, @dir)
    @sock = "#{@dir}/app.sock"
  end

  def teardown
    stop_nginx
    super
    FileUtils.rm_rf(@dir) if @dir
  end

  def start_blackbuck(*args)
    start_server(["-l", "unix:#{@sock}", *args], dir: @dir)
  end

  # nginx as Debian runs it: master root, workers www-data; proxies 127.0.0.1:PORT to @sock.
  def start_nginx = (@nginx = NginxProxy.new("unix:#{@sock}", user: NGINX_USER))

  def stop_nginx
    return unless @nginx

    warn "\n--- nginx error log ---\n#{@nginx.error_log}--- end ---" unless passed?
    @nginx.stop
  end

  def get_through_nginx
    Net::HTTP.start("127.0.0.1", @nginx.port, open_timeout: 5, read_timeout: 10) { |http| http.get("/") }
  end

  def test_nginx_as_www_data_reaches_a_socket_of_group_www_data_and_mode_0660
    start_blackbuck("--unix-socket-mode", "0660", "--unix-socket-group", NGINX_USER)
    st = File.stat(@sock)
    assert_equal 0o660, st.mode & 0o777
    assert_equal @gid, st.gid
    assert_equal 0, st.uid, "only the group changes"
    start_nginx
    res = get_through_nginx
    assert_equal "200", res.code, @nginx.error_log
    assert_equal "hello world\n", res.body
  end

  # The same setup without the group: the socket stays root's group, nginx's workers cannot
  # connect. This is what the test above would see if the group were not applied.
  def test_without_the_group_nginx_gets_permission_denied
    start_blackbuck("--unix-socket-mode", "0660")
    assert_equal 0, File.stat(@sock).gid
    start_nginx
    assert_equal "502", get_through_nginx.code
    assert_match(/connect\(\) to unix:#{Regexp.escape(@sock)} failed \(13: Permission denied\)/,
                 @nginx.error_log)
  end

  def test_config_file_directive_and_numeric_gid
    File.write("#{@dir}/blackbuck.rb", "unix_socket_mode 0o660\nunix_socket_group #{@gid}\n")
    start_blackbuck("-c", "#{@dir}/blackbuck.rb")
    assert_equal [0o660, @gid], File.stat(@sock).then { |st| [st.mode & 0o777, st.gid] }
  end

  # rackup passes unknown -O options to Config#set by their snake_case name.
  def test_rack_handler_option
    rack2 = Gem.loaded_specs["rack"]&.version.to_s.start_with?("2.")
    rackup = Gem.bin_path(rack2 ? "rack" : "rackup", "rackup")
    server = ChildProcess.new([RbConfig.ruby, "-I", File.join(ROOT, "lib"), rackup, "-s", "blackbuck", "-E", "none",
                               "-O", "Path=#{@sock}", "-O", "workers=1", "-O", "unix_socket_mode=0660",
                               "-O", "unix_socket_group=#{NGINX_USER}", File.join(APPS, "hello.ru")],
                              log_path: "#{@dir}/rackup.log")
    Timeout.timeout(20) { sleep 0.05 until server.log.include?("worker 0 (pid") || server.exited? }
    assert_equal [0o660, @gid], File.stat(@sock).then { |st| [st.mode & 0o777, st.gid] }, server.log
  ensure
    server&.stop
  end
end
