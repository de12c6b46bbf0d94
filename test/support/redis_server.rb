# frozen_string_literal: true

require "socket"
require "tmpdir"
require "fileutils"

# A redis-server of the test's own (Debian's redis-server, which bin/setup installs): on a UNIX
# socket in a directory of its own, no TCP port, nothing saved; stopped by its pid.
class RedisServer
  PATH = "/usr/bin/redis-server"
  READY_SECONDS = 15 # a bound for a start that went wrong

  def self.available? = File.executable?(PATH)

  attr_reader :socket

  def initialize
    @dir = Dir.mktmpdir("bb-redis")
    @socket = File.join(@dir, "redis.sock")
    @pid = Process.spawn(PATH, "--port", "0", "--unixsocket", @socket, "--unixsocketperm", "700",
                         "--save", "", "--appendonly", "no", "--dir", @dir, "--daemonize", "no",
                         out: File.join(@dir, "redis.log"), err: %i[child out])
    wait_ready
  end

  # What Rails' cable.yml reads (REDIS_URL): redis-client takes a socket path as unix://PATH.
  def url = "unix://#{@socket}"

  def log = File.exist?(File.join(@dir, "redis.log")) ? File.read(File.join(@dir, "redis.log")) : ""

  # PUBSUB CHANNELS: the channels some connection is subscribed to now.
  def channels
    UNIXSocket.open(@socket) do |s|
      s.write("PUBSUB CHANNELS\r\n")
      count = Integer(s.gets[/\A\*(\d+)/, 1])
      Array.new(count) do
        len = Integer(s.gets[/\A\$(\d+)/, 1])
        s.read(len + 2).chomp
      end
    end
  end

  def stop
    return unless @pid

    begin
      Process.kill(:TERM, @pid)
      Process.wait(@pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
    @pid = nil
    FileUtils.rm_rf(@dir)
  end

  private

  def wait_ready
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + READY_SECONDS
    until ping
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline || Process.waitpid(@pid, Process::WNOHANG)
        log_text = log
        stop
        raise "redis-server did not answer PING on #{@socket} within #{READY_SECONDS}s:\n#{log_text}"
      end
      sleep 0.05
    end
  end

  def ping
    UNIXSocket.open(@socket) do |s|
      s.write("PING\r\n")
      s.wait_readable(1) && s.readpartial(64).start_with?("+PONG")
    end
  rescue SystemCallError, IOError
    false
  end
end
