# frozen_string_literal: true

require_relative "../test_helper"

# Sinatra's own runner (`ruby app.rb` with `set :server, "blackbuck"`): it starts Blackbuck
# through the rack handler, keeps the object the handler yields, and on Ctrl-C or at exit calls
# its #stop. Sinatra 4 on Rack 3 here, Sinatra 3 on Rack 2.2 under `rake test:rack2`.
class SinatraTest < ServerTest
  APP = File.join(APPS, "sinatra_app.rb")

  def setup
    begin
      require "sinatra/base"
    rescue LoadError
      skip "sinatra is not in this bundle"
    end
    @dir = Dir.mktmpdir("bb-test")
    @port = free_port
    @app = ChildProcess.new([RbConfig.ruby, "-I", File.join(ROOT, "lib"), APP], log_path: "#{@dir}/sinatra.log",
                            env: { "PORT" => @port.to_s, "WEB_CONCURRENCY" => "2" })
    wait_for(30) { @app.log.scan(/worker \d \(pid \d+\) ready/).size == 2 || (@app.exited? && flunk(@app.log)) }
  end

  def teardown
    @app&.stop
    warn "\n--- sinatra log (#{name}) ---\n#{@app.log}--- end ---" if @app && !passed?
    FileUtils.rm_rf(@dir) if @dir
    super
  end

  def test_serves_and_ctrl_c_ends_cleanly
    io = TCPSocket.new("127.0.0.1", @port)
    assert_equal "sinatra says hi\n", request(io, "GET", "/").body
    assert_equal "hello blackbuck\n", request(io, "GET", "/hello/blackbuck").body
    io.close
    assert_match(/Sinatra \(v[\d.]+\) has taken the stage on #{@port} .* with backup from Blackbuck/, @app.log)
    Process.kill(:INT, -@app.pid) # Ctrl-C: the terminal signals the whole process group
    status = @app.wait_exit(15)
    assert status&.success?, "exit status #{status.inspect}:\n#{@app.log}"
    log = @app.log
    assert_match(/INT: stopping gracefully/, log)
    assert_match(/== Sinatra has ended his set/, log)
    refute_match(/undefined method|NoMethodError|Error\b.*\.rb:\d+/, log)
  ensure
    io&.close
  end

  def test_term_ends_cleanly_too
    @app.signal(:TERM)
    status = @app.wait_exit(15)
    assert status&.success?, @app.log
    refute_match(/undefined method|NoMethodError/, @app.log)
  end
end
