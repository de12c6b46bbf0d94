# frozen_string_literal: true

require_relative "../test_helper"
require "digest"
require "json"
require "open3"
require "uri"

# Bodies that name their file (`to_path`: Rack::Files, Rails' send_file, a Tempfile) are sent with
# the file's size as Content-Length and their bytes go from the file to the socket with sendfile(2)
# from the event loop, never through Ruby; X-Sendfile and X-Accel-Redirect when configured.
# One worker in every test, so a held worker would show as a late fresh request.
class FileBodyTest < ServerTest
  MIB = 1024 * 1024
  BIG = 5 * MIB + 7      # a few MiB, not a multiple of any buffer size
  HUGE = 64 * MIB        # more than the socket buffers, the memory queue and one flush (4 MiB) hold

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # curl over TCP and UNIX: Content-Length is the file's size and the bytes are the file's, for
  # Rack::Files, a to_path body, a Rails-shaped body (to_ary answers nil) and a Tempfile body that
  # is removed when closed. Ruby never iterated any of them.
  def test_to_path_bodies_get_content_length_and_their_bytes_over_tcp_and_unix
    skip "curl is not installed" unless system("command -v curl > /dev/null")
    server = files_server
    _, big = make_file("big.bin", BIG)
    _, empty = make_file("empty.bin", 0)
    tempfile = Digest::SHA256.hexdigest(Random.new(300_000).bytes(300_000))
    %i[tcp unix].each do |transport|
      {
        "/files/big.bin" => [BIG, big], "/path?name=big.bin" => [BIG, big], "/rails?name=big.bin" => [BIG, big],
        "/pathname?name=big.bin" => [BIG, big], "/path?name=empty.bin" => [0, empty], "/tempfile?bytes=300000" => [300_000, tempfile]
      }.each do |path, (size, digest)|
        status, headers, body = curl(server, path, transport: transport)
        where = "#{path} over #{transport}"
        assert_equal 200, status, where
        assert_equal size.to_s, headers["content-length"], where
        assert_nil headers["transfer-encoding"], where
        assert_equal [size, digest], [body.bytesize, Digest::SHA256.hexdigest(body)], where
      end
    end
    assert_equal 0, stats(server)["each"].to_i, "no body was iterated by Ruby"
    assert_equal 10, stats(server)["close"], "every body of the app's own classes was closed"
    assert_empty Dir.children(@files).grep(/bb-file-body/), "each Tempfile was removed when its body closed"
  end

  # HEAD: the head with the file's length and no body; then keep-alive and pipelining after file
  # responses: four requests in one write, answered in order on one connection.
  def test_head_keepalive_and_pipelining_after_file_responses
    server = files_server
    _, big = make_file("big.bin", BIG)
    _, small = make_file("small.bin", 1000)
    io = server.tcp
    res = request(io, "HEAD", "/rails?name=big.bin")
    assert_equal [200, BIG.to_s, ""], [res.status, res["content-length"], res.body]
    assert_equal "hello world\n", request(io, "GET", "/hello").body, "no body bytes followed the HEAD"

    io.write(["GET /path?name=big.bin", "HEAD /files/big.bin", "GET /files/small.bin", "GET /hello"]
               .map { |l| "#{l} HTTP/1.1\r\nHost: x\r\n\r\n" }.join)
    res = read_response(io, timeout: 30)
    assert_equal [200, BIG.to_s, big], [res.status, res["content-length"], Digest::SHA256.hexdigest(res.body)]
    res = read_response(io, head_request: true)
    assert_equal [200, BIG.to_s, ""], [res.status, res["content-length"], res.body]
    res = read_response(io)
    assert_equal [200, "1000", small], [res.status, res["content-length"], Digest::SHA256.hexdigest(res.body)]
    assert_equal "hello world\n", read_response(io).body
    assert_equal "hello world\n", request(io, "GET", "/hello", version: "1.0", headers: { "Connection" => "keep-alive" }).body
  ensure
    io&.close
  end

  # Not sent from the file: a 206 (Rack::Files' Range answer, and an app's 206 whose body names the
  # whole file but yields only the range) and a Content-Length that differs from the file's size
  # keep the app's status, length and bytes, streamed with each.
  def test_ranges_and_other_lengths_are_streamed_with_each
    server = files_server
    path, = make_file("big.bin", BIG)
    bytes = File.binread(path)
    io = server.tcp
    res = request(io, "GET", "/files/big.bin", headers: { "Range" => "bytes=100-199" })
    assert_equal [206, "bytes 100-199/#{BIG}", "100"], [res.status, res["content-range"], res["content-length"]]
    assert_equal bytes.byteslice(100, 100), res.body

    res = request(io, "GET", "/partial?name=big.bin&length=100")
    assert_equal [206, "100", bytes.byteslice(0, 100)], [res.status, res["content-length"], res.body]
    res = request(io, "GET", "/partial?name=big.bin&length=#{BIG}") # "bytes=0-": all of it, still a 206
    assert_equal [206, "bytes 0-#{BIG - 1}/#{BIG}", BIG.to_s], [res.status, res["content-range"], res["content-length"]]
    assert_equal bytes, res.body
    res = request(io, "GET", "/length?name=big.bin&length=100")
    assert_equal [200, "100", bytes.byteslice(0, 100)], [res.status, res["content-length"], res.body]
    assert_equal "hello world\n", request(io, "GET", "/hello").body, "the connection stays in sync"
    assert_equal 3, stats(server)["each"], "those three bodies were iterated by Ruby"
  ensure
    io&.close
  end

  # A client that stops reading a 64 MiB download does not hold the worker, and the rest of the file
  # is not copied anywhere (no spill file): the worker holds the file itself and sends it as the
  # client reads, every byte.
  def test_a_slow_reader_of_a_large_file_does_not_hold_the_worker
    server = files_server(["--write-timeout", "10"])
    worker = server.worker_pids.first
    path, digest = make_file("huge.bin", HUGE)
    io = stalled_request(server, "/rails?name=huge.bin")
    wait_for(30) { fd_links(worker).include?(path) }
    sending = -> { fd_links(worker).include?(path) } # the worker still holds the file: the download is not over
    assert_fresh_request_served(server, behind: "a stalled reader of a 64 MiB file", held: sending)
    assert_empty Dir.children(@tmp), "nothing spilled to $TMPDIR"
    assert_includes fd_links(worker), path, "the worker sends from the file itself"

    status, headers, got, size = read_framed(io, pace: 0.001) do
      assert_fresh_request_served(server, behind: "a slow reader of a 64 MiB file", held: sending)
    end
    assert_equal [200, HUGE.to_s, HUGE, digest], [status, headers["content-length"], size, got]
    wait_for(15) { !fd_links(worker).include?(path) }
    assert_equal 200, request(io, "GET", "/hello")&.status, "kept alive after the download"
  ensure
    io&.close
  end

  # The bytes do not pass through Ruby. Rack::Files iterates a file in 8 KiB Strings, so streaming
  # 64 MiB would allocate at least 8192 objects in the worker; sent from the file it allocates a
  # few hundred (the request, its env and headers, and the /stats requests around it), and the
  # body's each is never called. (RSS would not tell: a streamed body goes to a spill file, not memory.)
  def test_the_bytes_of_a_file_do_not_pass_through_ruby
    server = files_server
    _, digest = make_file("huge.bin", HUGE)
    stats(server)
    before = stats(server)["objects"]
    io = server.tcp
    io.write("GET /files/huge.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, got, size = read_framed(io)
    assert_equal [200, HUGE.to_s, HUGE, digest], [status, headers["content-length"], size, got]
    allocated = stats(server)["objects"] - before
    assert_operator allocated, :<, 2000, "objects the worker allocated to serve 64 MiB"
    assert_equal 0, stats(server)["each"].to_i
  ensure
    io&.close
  end

  # A file truncated while it is sent: the promised Content-Length cannot be met, so the connection
  # is closed (never padded, never left hanging) and the log says why; the bytes sent are the file's.
  def test_a_file_truncated_while_sent_closes_the_connection
    server = files_server(["--write-timeout", "10"])
    worker = server.worker_pids.first
    path, = make_file("shrinks.bin", 32 * MIB)
    original = File.binread(path)
    io = stalled_request(server, "/path?name=shrinks.bin")
    wait_for(30) { fd_links(worker).include?(path) }
    assert io.wait_readable(30), "the download has begun"
    File.truncate(path, MIB)
    head, body = read_until_closed(io)
    assert_match(/\AHTTP\/1.1 200 OK\r\n/, head)
    assert_match(/^Content-Length: #{32 * MIB}\r$/, head)
    assert_operator body.bytesize, :<, 32 * MIB, "the connection closed short of the promised length"
    assert_equal original.byteslice(0, body.bytesize), body, "what was sent is the file's bytes, not padding"
    wait_for(15) { server.log.include?("a file body ended at byte") }
    assert_match(/WARN a file body ended at byte \d+ of the #{32 * MIB} promised .*: connection closed/, server.log)
    wait_for(15) { !fd_links(worker).include?(path) }
    assert_fresh_request_served(server, behind: "a truncated download")
  ensure
    io&.close
  end

  # A file that grows while it is sent: exactly the promised length goes out, and the connection
  # stays usable.
  def test_a_file_grown_while_sent_sends_exactly_the_promised_length
    server = files_server
    worker = server.worker_pids.first
    path, digest = make_file("grows.bin", 16 * MIB)
    io = stalled_request(server, "/files/grows.bin")
    wait_for(15) { fd_links(worker).include?(path) }
    File.open(path, "ab") { |f| f.write("x" * MIB) }
    status, headers, got, size = read_framed(io)
    assert_equal [200, (16 * MIB).to_s, 16 * MIB, digest], [status, headers["content-length"], size, got]
    assert_equal "hello world\n", request(io, "GET", "/hello")&.body, "no byte past the promised length"
  ensure
    io&.close
  end

  # No descriptor is left behind: downloads completed, one aborted by the client mid-way, one whose
  # client stops reading until write_timeout drops it.
  def test_no_descriptor_leaks
    server = files_server(["--write-timeout", "1.5"])
    worker = server.worker_pids.first
    path, = make_file("huge.bin", HUGE)
    make_file("big.bin", BIG)
    assert_fresh_request_served(server)
    baseline = wait_for { n = fd_links(worker).size; sleep 0.2; n == fd_links(worker).size && n }

    3.times do
      io = server.tcp
      res = request(io, "GET", "/path?name=big.bin")
      assert_equal BIG, res.body.bytesize
      assert_equal BIG.to_s, request(io, "HEAD", "/files/big.bin")["content-length"]
      io.close
    end
    wait_for(15) { fd_links(worker).size == baseline }

    aborted = stalled_request(server, "/files/huge.bin")
    wait_for(15) { fd_links(worker).include?(path) }
    aborted.readpartial(65_536)
    aborted.close # mid-way, unread bytes and all
    wait_for(15) { fd_links(worker).size == baseline }

    stalled = stalled_request(server, "/rails?name=huge.bin")
    started = now
    wait_for(15) { fd_links(worker).include?(path) }
    assert_equal baseline + 2, fd_links(worker).size, "the stalled client's socket and the file"
    wait_for(30) { fd_links(worker).size == baseline }
    assert_operator now - started, :>=, 1.3, "dropped by write_timeout (1.5 s), not before"
    refute_includes fd_links(worker), path
    assert_operator read_all(stalled).bytesize, :<, HUGE, "dropped: it cannot have the whole file"
    assert_fresh_request_served(server)
  ensure
    aborted&.close
    stalled&.close
  end

  # x_sendfile on: the header is removed and the named file is the body (Content-Length, sendfile,
  # HEAD), for any case of the header name and behind Rack::Sendfile; a missing file or a
  # directory is a 404 and a relative path a 500, each with one log line. X-Accel-Redirect passes.
  def test_x_sendfile_when_configured
    server = files_server(["--x-sendfile"])
    path, big = make_file("big.bin", BIG)
    io = server.unix
    ["/x-sendfile?path=#{q(path)}", "/x-sendfile-caps?path=#{q(path)}", "/rack-sendfile/big.bin"].each do |url|
      res = request(io, "GET", url)
      assert_equal [200, BIG.to_s, big], [res.status, res["content-length"], Digest::SHA256.hexdigest(res.body)], url
      assert_nil res["x-sendfile"], url
    end
    assert_equal "application/x-test", request(io, "GET", "/x-sendfile?path=#{q(path)}")["content-type"], "other headers kept"
    res = request(io, "HEAD", "/x-sendfile?path=#{q(path)}")
    assert_equal [200, BIG.to_s, ""], [res.status, res["content-length"], res.body]

    missing = File.join(@files, "missing.bin")
    res = request(io, "GET", "/x-sendfile?path=#{q(missing)}")
    assert_equal [404, "Not Found\n"], [res.status, res.body]
    assert_equal "hello world\n", request(io, "GET", "/hello").body, "kept alive after the 404"
    assert_equal 404, request(io, "GET", "/x-sendfile?path=#{q(@files)}").status
    assert_equal 500, request(io, "GET", "/x-sendfile?path=files/big.bin").status

    res = request(tcp = server.tcp, "GET", "/x-accel?uri=/protected/big.bin")
    tcp.close
    assert_equal ["/protected/big.bin", "0", ""], [res["x-accel-redirect"], res["content-length"], res.body]
    wait_for(15) { server.log.scan(/ERROR X-Sendfile/).size == 3 }
    assert_match(/ERROR X-Sendfile #{Regexp.escape(missing)}: No such file or directory: 404 for GET \/x-sendfile$/, server.log)
    assert_match(/ERROR X-Sendfile #{Regexp.escape(@files)}: not a regular file: 404/, server.log)
    assert_match(/ERROR X-Sendfile "files\/big.bin" is not an absolute path: refused: GET \/x-sendfile$/, server.log)
    assert_equal 0, stats(server)["each"].to_i
    assert_operator stats(server)["close"], :>=, 5, "the app's bodies were closed"
  ensure
    io&.close
  end

  # Off by default: X-Sendfile and X-Accel-Redirect pass through untouched (nginx in front acts on them).
  def test_x_sendfile_and_x_accel_redirect_pass_through_by_default
    server = files_server
    path, = make_file("big.bin", BIG)
    io = server.tcp
    res = request(io, "GET", "/x-sendfile?path=#{q(path)}")
    assert_equal [200, path, "0", ""], [res.status, res["x-sendfile"], res["content-length"], res.body]
    res = request(io, "GET", "/rack-accel/big.bin")
    assert_equal [200, "/protected/big.bin", "0", ""], [res.status, res["x-accel-redirect"], res["content-length"], res.body]
  ensure
    io&.close
  end

  # x_accel_mapping: the URI is served from the mapped directory (query ignored, %-escapes decoded,
  # the longest prefix first); a URI outside every mapping or one that escapes its directory with
  # "..", plain or %-encoded, is refused with a 500 and one log line, never served.
  def test_x_accel_redirect_with_a_mapping
    dir = Dir.mktmpdir("bb-test")
    other = File.join(dir, "other")
    Dir.mkdir(other)
    File.write(File.join(other, "small.bin"), "from the other directory\n")
    server = files_server(["--x-accel-mapping", "/protected/=#{File.join(dir, 'files')}", "--x-accel-mapping",
                           "/protected/other=#{other}"], dir: dir)
    path, big = make_file("big.bin", BIG)
    _, odd = make_file("a b?.txt", 1234)
    File.write(File.join(server.dir, "secret.txt"), "secret\n")
    io = server.tcp
    { "/protected/big.bin" => big, "/protected/a%20b%3F.txt" => odd, "/protected/big.bin?x=1" => big }.each do |uri, digest|
      res = request(io, "GET", "/x-accel?uri=#{q(uri)}")
      assert_equal [200, digest], [res.status, Digest::SHA256.hexdigest(res.body)], uri
      assert_nil res["x-accel-redirect"]
    end
    res = request(io, "GET", "/rack-accel/big.bin")
    assert_equal [200, BIG.to_s, big], [res.status, res["content-length"], Digest::SHA256.hexdigest(res.body)]
    assert_equal "from the other directory\n", request(io, "GET", "/x-accel?uri=#{q('/protected/other/small.bin')}").body
    assert_equal BIG.to_s, request(io, "HEAD", "/x-accel?uri=#{q('/protected/big.bin')}")["content-length"]
    assert_equal 404, request(io, "GET", "/x-accel?uri=#{q('/protected/missing.bin')}").status
    io.close

    refused = ["/protected/../secret.txt", "/protected/%2e%2e/secret.txt", "/protected/%2E%2E%2Fsecret.txt",
               "/protected/x/%2e%2e/%2e%2e/secret.txt", "/protected/./big.bin", "/elsewhere/big.bin", "/protected/%zz",
               "/protected/big.bin%00"]
    refused.each do |uri|
      res = request(io = server.tcp, "GET", "/x-accel?uri=#{q(uri)}")
      assert_equal 500, res.status, uri
      refute_includes res.body, "secret", uri
      io.close
    end
    wait_for(15) { server.log.scan(/ERROR X-Accel-Redirect .*: refused/).size == refused.size }
    assert_match(/ERROR X-Accel-Redirect "\/elsewhere\/big.bin" is outside every x_accel_mapping: refused/, server.log)
    res = request(io = server.tcp, "GET", "/x-sendfile?path=#{q(path)}")
    assert_equal [path, ""], [res["x-sendfile"], res.body], "X-Sendfile passes through when only the mapping is set"
  ensure
    io&.close
  end

  def test_bad_x_accel_mapping_is_one_line_and_exit_1
    out, status = Open3.capture2e(RbConfig.ruby, EXE, "--x-accel-mapping", "files=/srv", "--check",
                                  File.join(APPS, "hello.ru"))
    assert_equal 1, status.exitstatus
    assert_equal ["blackbuck: x_accel_mapping must be URI_PREFIX=DIRECTORY, both starting with /, got \"files=/srv\"\n"],
                 out.lines.grep(/\Ablackbuck: /), out
    refute_match(/^\s+from |\.rb:\d+:in /, out, "no backtrace")
  end

  private

  # The server's directory holds files/ (BB_FILES_DIR, what the app serves) and tmp/ ($TMPDIR,
  # where spill files would go).
  def files_server(args = [], dir: Dir.mktmpdir("bb-test"))
    @files = File.join(dir, "files")
    @tmp = File.join(dir, "tmp")
    FileUtils.mkdir_p([@files, @tmp])
    start_server(["-l", "127.0.0.1:0", "-l", "unix:#{dir}/app.sock", *args], app: "files.ru", dir: dir,
                                                                            env: { "BB_FILES_DIR" => @files, "TMPDIR" => @tmp })
  end

  # A file of size pseudo-random bytes in files/: [path, SHA-256].
  def make_file(name, size)
    path = File.join(@files, name)
    digest = Digest::SHA256.new
    rng = Random.new(size)
    File.open(path, "wb") do |f|
      left = size
      while left.positive?
        chunk = rng.bytes([left, MIB].min)
        f.write(chunk)
        digest << chunk
        left -= chunk.bytesize
      end
    end
    [path, digest.hexdigest]
  end

  def q(s) = URI.encode_www_form_component(s)

  def stats(server)
    io = server.tcp
    JSON.parse(request(io, "GET", "/stats").body)
  ensure
    io&.close
  end

  # curl: [status, headers (lower-case names), body]
  def curl(server, path, transport: :tcp)
    out = File.join(server.dir, "curl.out")
    url = transport == :tcp ? ["http://127.0.0.1:#{server.tcp_port}#{path}"] : ["--unix-socket", server.unix_path, "http://localhost#{path}"]
    head, status = Open3.capture2("curl", "-sS", "--max-time", "30", "-o", out, "-D", "-", *url)
    assert status.success?, "curl #{path} failed"
    lines = head.split("\r\n")
    headers = lines.drop(1).to_h { |l| k, v = l.split(":", 2); [k.downcase, v.strip] }
    [lines.first[/\AHTTP\/1\.1 (\d{3})/, 1].to_i, headers, File.binread(out)]
  end

  # One Content-Length response, its body hashed as it arrives: [status, headers, SHA-256, size].
  # pace: seconds to sleep after each read (a slow reader); the block runs once, a quarter in.
  def read_framed(io, pace: 0, timeout: 60)
    Timeout.timeout(timeout) do
      buf = +"".b
      buf << io.readpartial(65_536) until buf.include?("\r\n\r\n")
      head, rest = buf.split("\r\n\r\n", 2)
      lines = head.split("\r\n")
      headers = lines.drop(1).to_h { |l| k, v = l.split(":", 2); [k.downcase, v.strip] }
      left = Integer(headers.fetch("content-length"))
      digest = Digest::SHA256.new
      size = 0
      called = false
      while left.positive?
        data = rest.empty? ? io.readpartial([left, 1 << 16].min) : rest.byteslice(0, left)
        rest = +""
        digest << data
        size += data.bytesize
        left -= data.bytesize
        sleep pace if pace.positive?
        next unless block_given? && !called && size > HUGE / 4

        called = true
        yield
      end
      io.ungetbyte(rest) unless rest.empty?
      [lines.first[/\AHTTP\/1\.1 (\d{3})/, 1].to_i, headers, digest.hexdigest, size]
    end
  end

  # Everything until the server closes: [head, body].
  def read_until_closed(io, timeout: 30)
    data = +"".b
    Timeout.timeout(timeout) { loop { data << io.readpartial(1 << 16) } }
  rescue EOFError, Errno::ECONNRESET
    data.split("\r\n\r\n", 2)
  end
end
