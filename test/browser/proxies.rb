# frozen_string_literal: true

# Debian's nginx serving one site file (what /etc/nginx/sites-enabled/ holds: blocks of the http
# context), inside a main config like Debian's nginx.conf: `user www-data;`, so its workers connect
# to the upstream socket as www-data. Started and stopped by pid.
class NginxSite
  BIN = "/usr/sbin/nginx"
  USER = "www-data"

  def self.available? = File.executable?(BIN)

  attr_reader :port # the site's `listen` port on 127.0.0.1

  def initialize(site, port:)
    @port = port
    @dir = Dir.mktmpdir("bb-browser-nginx")
    File.chmod(0o711, @dir) # the workers (www-data) reach their temp directories in it, which nginx gives them
    File.write("#{@dir}/site.conf", site)
    File.write("#{@dir}/nginx.conf", <<~CONF)
      user #{USER};
      worker_processes 1;
      daemon off;
      pid #{@dir}/nginx.pid;
      error_log #{@dir}/error.log;
      events { worker_connections 256; }
      http {
        access_log off;
        client_body_temp_path #{@dir}/body; proxy_temp_path #{@dir}/proxy;
        fastcgi_temp_path #{@dir}/fcgi; uwsgi_temp_path #{@dir}/uwsgi; scgi_temp_path #{@dir}/scgi;
        include #{@dir}/site.conf;
      }
    CONF
    @process = ChildProcess.new([BIN, "-p", @dir, "-c", "#{@dir}/nginx.conf"], log_path: "#{@dir}/out.log")
    ProxyPort.wait(port, @process, "nginx")
  end

  def error_log = File.exist?("#{@dir}/error.log") ? File.read("#{@dir}/error.log") : ""
  def log = "#{@process.log}#{error_log}"

  def stop
    @process.stop
    FileUtils.rm_rf(@dir)
  end
end

# HAProxy (Debian's 2.6) in the foreground with one config file. Started and stopped by pid.
class HAProxyProcess
  BIN = "/usr/sbin/haproxy"

  def self.available? = File.executable?(BIN)

  def initialize(config, port:)
    @dir = Dir.mktmpdir("bb-browser-haproxy")
    File.write("#{@dir}/haproxy.cfg", config)
    @process = ChildProcess.new([BIN, "-db", "-f", "#{@dir}/haproxy.cfg"], log_path: "#{@dir}/out.log")
    ProxyPort.wait(port, @process, "haproxy")
  end

  def log = @process.log

  def stop
    @process.stop
    FileUtils.rm_rf(@dir)
  end
end

# Waits until a proxy accepts connections on 127.0.0.1:port.
module ProxyPort
  def self.wait(port, process, name, timeout: 20)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    begin
      TCPSocket.new("127.0.0.1", port).close
    rescue Errno::ECONNREFUSED
      raise "#{name} exited:\n#{process.log}" if process.exited?
      raise "#{name} not listening on #{port} within #{timeout}s:\n#{process.log}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
      retry
    end
  end
end
