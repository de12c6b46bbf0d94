# frozen_string_literal: true

require_relative "../test_helper"

# body.close is always called, rack.response_finished callbacks run after the response.
class RackCallbacksTest < ServerTest
  def test_body_close_and_response_finished
    dir = Dir.mktmpdir("bb-test")
    env = { "BB_CLOSE_MARK" => "#{dir}/closed", "BB_FINISHED_MARK" => "#{dir}/finished" }
    server = start_server(["-l", "127.0.0.1:0"], app: "kitchen.ru", env: env, dir: dir)
    io = server.tcp
    assert_equal "abbccc", request(io, "GET", "/each").body
    # close runs right after the last byte; File.write creates the file before it writes (seen empty once)
    Timeout.timeout(15) { sleep 0.02 until File.size?("#{dir}/closed") }
    assert_equal "closed", File.read("#{dir}/closed")
    File.delete("#{dir}/closed")
    io.close
    # a client that disconnects before reading: close is still called
    io = server.tcp
    io.write("GET /each HTTP/1.1\r\nHost: x\r\n\r\n")
    io.close
    Timeout.timeout(15) { sleep 0.05 until File.exist?("#{dir}/closed") }
    io = server.tcp
    assert_equal "ok", request(io, "GET", "/finished").body
    Timeout.timeout(15) { sleep 0.05 until File.exist?("#{dir}/finished") }
  ensure
    io&.close
  end
end
