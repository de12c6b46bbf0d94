# frozen_string_literal: true

# For the descriptor-limit tests (test/integration/handoff_limits_test.rb): a worker made to run out
# of file descriptors on demand.
#   GET /?sleep=SECONDS  waits that long
#   GET /hog?free=N      opens /dev/null until the worker's table is full (EMFILE), then closes N of
#                        them again and holds the rest: the worker has N descriptors free
#   GET /release         closes every descriptor /hog holds
# Every answer names the worker that ran it and what it holds: "pid=123 held=19987\n".
HELD = [] # rubocop:disable Style/MutableConstant

run lambda { |env|
  query = env["QUERY_STRING"].to_s
  case env["PATH_INFO"]
  when "/hog"
    begin
      loop { HELD << File.open(File::NULL) }
    rescue Errno::EMFILE, Errno::ENFILE
      nil
    end
    HELD.pop(query[/free=(\d+)/, 1].to_i).each(&:close)
  when "/release"
    HELD.each(&:close)
    HELD.clear
  end
  secs = query[/sleep=([\d.]+)/, 1]
  sleep(Float(secs)) if secs
  body = "pid=#{Process.pid} held=#{HELD.size}\n"
  [200, { "content-type" => "text/plain", "content-length" => body.bytesize.to_s }, [body]]
}
