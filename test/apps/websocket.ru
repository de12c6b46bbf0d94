# frozen_string_literal: true

# WebSocket echo over rack.hijack, the two ways apps do it:
#   /full     full hijack (env["rack.hijack"].call) with websocket-driver, as Action Cable does;
#   /partial  partial hijack (a "rack.hijack" response header): the server sends the app's 101
#             head, then the app speaks the frames itself.
# Each connection is served by a thread of the app's, as with Puma; the worker forgets the socket.
require "websocket/driver"
require "digest/sha1"
require "base64"

# What WebSocket::Driver.rack wants of a socket: the env, its URL, and write.
class HijackedSocket
  attr_reader :env, :url

  def initialize(env, io)
    @env = env
    @io = io
    @url = "ws://#{env['HTTP_HOST']}#{env['REQUEST_URI']}"
  end

  def write(data) = @io.write(data)
end

# The few frames the partial-hijack echo needs (RFC 6455 5.2): unmasked out, masked in.
module Frames
  module_function

  def text(data)
    data = data.b
    head = [0x81].pack("C")
    head << (data.bytesize < 126 ? [data.bytesize].pack("C") : [126, data.bytesize].pack("Cn"))
    head + data
  end

  def close_frame = [0x88, 2, 1000].pack("CCn") # "normal closure"

  # [opcode, payload] or nil at end of input.
  def read(io)
    b0, b1 = io.read(2)&.unpack("CC")
    return nil unless b1

    len = b1 & 0x7f
    len = io.read(2).unpack1("n") if len == 126
    len = io.read(8).unpack1("Q>") if len == 127
    mask = (b1 & 0x80).zero? ? nil : io.read(4).bytes
    payload = (io.read(len) || "").bytes
    payload = payload.each_with_index.map { |b, i| b ^ mask[i % 4] } if mask
    [b0 & 0x0f, payload.pack("C*")]
  end
end

def full(env)
  io = env["rack.hijack"].call
  driver = WebSocket::Driver.rack(HijackedSocket.new(env, io))
  driver.on(:message) { |e| driver.text("echo:#{e.data}") }
  driver.on(:close) { io.close unless io.closed? }
  Thread.new do
    driver.start
    loop { driver.parse(io.readpartial(4096)) }
  rescue EOFError, IOError, SystemCallError
    nil
  ensure
    io.close unless io.closed?
  end
  [-1, {}, []]
end

def partial(env)
  accept = Base64.strict_encode64(Digest::SHA1.digest("#{env['HTTP_SEC_WEBSOCKET_KEY']}258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
  echo = lambda do |io|
    Thread.new do
      while (frame = Frames.read(io))
        opcode, payload = frame
        if opcode == 0x8
          io.write(Frames.close_frame)
          break
        end
        io.write(Frames.text("echo:#{payload}")) if opcode == 0x1
      end
    rescue IOError, SystemCallError
      nil
    ensure
      io.close unless io.closed?
    end
  end
  [101, { "upgrade" => "websocket", "connection" => "Upgrade", "sec-websocket-accept" => accept, "rack.hijack" => echo }, []]
end

run lambda { |env|
  case env["PATH_INFO"]
  when "/full" then full(env)
  when "/partial" then partial(env)
  else [200, { "content-type" => "text/plain" }, ["hello world\n"]]
  end
}
