# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/redis_server"
require "securerandom"
require "uri"

# Action Cable on Redis (test/apps/rails_cable: the adapter `rails new` gives production before
# Rails 8) under the blackbuck command with refork_after, against a redis-server of the test's own:
# after each refork a new subscription is confirmed, a broadcast reaches it and the heartbeat pings
# it, in a worker forked by the mold of that generation. The worker that forks each mold had its
# Redis listener running (a subscriber was confirmed on it and heard a broadcast). Before the fix
# the mold's workers inherited the listener without its thread: the subscription was never
# confirmed and nothing was logged. Runs under gemfiles/rails7 and rails8 (rake test:rails); skips
# where Action Cable or the redis gem is not in the bundle.
class ActionCableTest < ServerTest
  APP = File.join(APPS, "rails_cable")
  CABLE_SECONDS = 20 # a bound for a subscription, a broadcast or a ping that went wrong (Action Cable pings every 3 s)
  REFORK_SECONDS = 90 # a bound for a refork driven by the requests below that went wrong

  # A raw Action Cable client (protocol actioncable-v1-json) over one WebSocket: the handshake,
  # masked text frames out, the server's JSON messages in.
  class CableClient
    attr_reader :messages

    def initialize(io)
      @io = io
      @buffer = +"".b
      @messages = []
      key = [SecureRandom.bytes(16)].pack("m0")
      @io.write("GET /cable HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" \
                "Sec-WebSocket-Key: #{key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: actioncable-v1-json\r\n\r\n")
      fill until @buffer.include?("\r\n\r\n")
      head, @buffer = @buffer.split("\r\n\r\n", 2)
      raise "no WebSocket: #{head}" unless head.start_with?("HTTP/1.1 101")
    end

    def subscribe(channel) = send_json("command" => "subscribe", "identifier" => { "channel" => channel }.to_json)

    # Reads until a message the block accepts has arrived (every message is kept in #messages);
    # returns it, or nil after seconds.
    def wait_for(seconds)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      loop do
        found = @messages.find { |m| yield m }
        return found if found

        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        return nil unless left.positive? && @io.wait_readable(left)

        fill
        read_frames
      end
    end

    def close = @io.close

    private

    def send_json(obj)
      data = obj.to_json.b
      mask = SecureRandom.bytes(4).bytes
      head = data.bytesize < 126 ? [0x81, 0x80 | data.bytesize].pack("CC") : [0x81, 0x80 | 126, data.bytesize].pack("CCn")
      @io.write(head + mask.pack("C4") + data.bytes.each_with_index.map { |b, i| b ^ mask[i % 4] }.pack("C*"))
    end

    def fill = @buffer << @io.readpartial(65_536)

    # Complete frames out of the buffer: text frames as JSON messages; a close frame as :closed.
    def read_frames
      while @buffer.bytesize >= 2
        opcode = @buffer.getbyte(0) & 0x0f
        len = @buffer.getbyte(1) & 0x7f
        offset = 2
        len, offset = [@buffer.byteslice(2, 2).unpack1("n"), 4] if len == 126
        len, offset = [@buffer.byteslice(2, 8).unpack1("Q>"), 10] if len == 127
        return if len.nil? || @buffer.bytesize < offset + len

        payload = @buffer.byteslice(offset, len)
        @buffer = @buffer.byteslice(offset + len..)
        @messages << JSON.parse(payload) if opcode == 1
        @messages << { "type" => "closed" } if opcode == 8
      end
    end
  end

  def setup
    begin
      require "action_cable/version"
      require "redis"
    rescue LoadError
      skip "Action Cable with the redis gem is not in this bundle (rake test:rails runs this file under gemfiles/rails7 and rails8)"
    end
    unless RedisServer.available?
      flunk "missing under CI: redis-server (bin/setup installs it)" if ENV["CI"] == "true"
      skip "needs redis-server (apt-get install redis-server)"
    end
    @redis = RedisServer.new
    @app_dir = Dir.mktmpdir("bb-test-cable")
    FileUtils.cp_r("#{APP}/.", @app_dir)
  end

  def teardown
    super
    @clients&.each(&:close)
    @redis&.stop
    FileUtils.rm_rf(@app_dir) if @app_dir
  end

  def test_action_cable_on_redis_works_in_every_generation_of_two_reforks
    File.write("#{@app_dir}/config/blackbuck.rb", "refork_after 20, 20\n")
    server = start_server(["-E", "production", "-c", "#{@app_dir}/config/blackbuck.rb", "-l", "127.0.0.1:0",
                           "--stats-listen", "unix:#{@app_dir}/status.sock"],
                          app: "#{@app_dir}/config.ru", workers: 1, dir: @app_dir, chdir: @app_dir,
                          env: { "REDIS_URL" => @redis.url })
    stats = "#{@app_dir}/status.sock"
    [0, 1, 2].each do |gen|
      worker = drive_to_generation(server, stats, gen)["workers"].first["pid"]
      # One worker: it holds the WebSocket, runs the broadcast, and (generations 0 and 1) forks the next mold.
      client = subscribed_client(server, "generation #{gen}")
      token = "generation #{gen} #{SecureRandom.hex(4)}"
      assert_equal worker.to_s, broadcast(server, token), "generation #{gen}'s worker broadcast"
      # (a ping's "message" is its time, an Integer: only a broadcast's is a Hash)
      heard = client.wait_for(CABLE_SECONDS) { |m| m["message"].is_a?(Hash) && m["message"]["text"]&.start_with?(token) }
      assert heard, "generation #{gen}: the subscriber heard #{token.inspect} (got #{client.messages.inspect})\n#{server.log}"
      assert_equal "#{token} from #{worker}", heard.dig("message", "text")
      pinged = client.wait_for(CABLE_SECONDS) { |m| m["type"] == "ping" }
      assert pinged, "generation #{gen}: Action Cable's heartbeat pings the subscriber (got #{client.messages.inspect})"
    end
    assert_match(/mold \(pid \d+\) ready; Action Cable reset/, server.log, "the mold of each refork says it reset Action Cable")
    refute_match(/ERROR|FATAL/, server.log)
  end

  # The app's own after_refork runs in the mold a worker forked, before it forks a worker: once per
  # refork, not in the mold that booted the app. One that raises ends reforking, and the server says why.
  def test_after_refork_runs_in_the_mold_and_one_that_raises_ends_reforking
    marks = "#{@app_dir}/marks"
    File.write("#{@app_dir}/config/blackbuck.rb", <<~RUBY)
      refork_after 10, 10
      after_refork { |server| File.write("#{marks}", "\#{Process.pid} \#{server.class}\\n", mode: "a") }
    RUBY
    server = start_server(["-E", "production", "-c", "#{@app_dir}/config/blackbuck.rb", "-l", "127.0.0.1:0",
                           "--stats-listen", "unix:#{@app_dir}/status.sock"],
                          app: "#{@app_dir}/config.ru", workers: 1, dir: @app_dir, chdir: @app_dir,
                          env: { "REDIS_URL" => @redis.url })
    settled = drive_to_generation(server, "#{@app_dir}/status.sock", 2)
    molds = server.log.scan(/refork: mold of generation \d is pid (\d+) \(forked by worker/).flatten
    assert_equal 2, molds.size
    assert_equal molds.map { |pid| "#{pid} Blackbuck::Supervisor" }, File.readlines(marks, chomp: true),
                 "after_refork ran once in each mold a worker forked"
    assert_equal molds.last.to_i, settled.dig("refork", "mold", "pid")
    server.stop

    File.write("#{@app_dir}/config/blackbuck.rb", "refork_after 10, 10\nafter_refork { |_server| raise \"no refork here\" }\n")
    server = start_server(["-E", "production", "-c", "#{@app_dir}/config/blackbuck.rb", "-l", "127.0.0.1:0",
                           "--stats-listen", "unix:#{@app_dir}/status2.sock"],
                          app: "#{@app_dir}/config.ru", workers: 1, dir: Dir.mktmpdir("bb-test-cable", @app_dir),
                          chdir: @app_dir, env: { "REDIS_URL" => @redis.url })
    wait_for(REFORK_SECONDS, "reforking turned off after after_refork raised") do
      get_pid(server)
      server.log[/refork: worker 0 \(pid \d+\) is not fork-safe \(after_refork raised RuntimeError: no refork here\); reforking is off/]
    end
    assert_match(/mold \(pid \d+\) failed.*no refork here/m, server.log)
    5.times { get_pid(server) } # it serves on, from generation 0
    assert_equal 0, status_json("#{@app_dir}/status2.sock").dig("refork", "generation")
  end

  private

  # A new WebSocket to the server, subscribed to RoomChannel (the confirmation has arrived).
  def subscribed_client(server, what)
    client = CableClient.new(server.tcp)
    (@clients ||= []) << client
    assert client.wait_for(CABLE_SECONDS) { |m| m["type"] == "welcome" }, "#{what}: Action Cable's welcome"
    client.subscribe("RoomChannel")
    confirmed = client.wait_for(CABLE_SECONDS) { |m| m["type"] == "confirm_subscription" }
    assert confirmed, "#{what}: the subscription is confirmed (got #{client.messages.inspect})\n#{server.log}"
    client
  end

  # POST /broadcast?text=...; the pid of the worker that broadcast.
  def broadcast(server, text)
    io = server.tcp
    res = request(io, "POST", "/broadcast?text=#{URI.encode_www_form_component(text)}", body: "")
    assert_equal 200, res.status, res.body
    res.body
  ensure
    io&.close
  end

  def get_pid(server)
    io = server.tcp
    res = request(io, "GET", "/pid")
    assert_equal 200, res.status, res.body
    res.body
  ensure
    io&.close
  end

  # GET /pid on fresh connections until generation gen has its mold and its worker is serving.
  # Returns that /status. (Generation 0 sends no request: it only waits for its worker.)
  def drive_to_generation(server, stats, gen)
    wait_for(REFORK_SECONDS, "refork generation #{gen}") do
      get_pid(server) if gen.positive?
      s = status_json(stats)
      # (a worker listed: between the old worker's exit and the new one's start the list is empty)
      s if s.dig("refork", "generation") == gen && (gen.zero? || s.dig("refork", "mold")) && !s["workers"].empty? &&
           s["workers"].all? { |w| w["generation"] == gen && w["state"] != "starting" }
    end
  end
end
