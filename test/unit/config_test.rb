# frozen_string_literal: true

require "minitest/autorun"
require "minitest/mock"
require "blackbuck"
require "socket"
require "tmpdir"

class ListenersParseTest < Minitest::Test
  def test_forms
    {
      "127.0.0.1:8080" => [:tcp, "127.0.0.1", 8080],
      ":8080" => [:tcp, "0.0.0.0", 8080],
      "8080" => [:tcp, "0.0.0.0", 8080],
      "localhost:0" => [:tcp, "localhost", 0],
      "[::1]:9000" => [:tcp, "::1", 9000],
      "unix:/tmp/a.sock" => [:unix, nil, "/tmp/a.sock"],
      "/tmp/b.sock" => [:unix, nil, "/tmp/b.sock"]
    }.each { |addr, want| assert_equal want, Blackbuck::Listeners.parse(addr), addr }
  end

  # The status listener's address without a host binds loopback; an app listener's, every interface.
  def test_forms_without_a_host_take_the_bare_host
    { ":9393" => [:tcp, "127.0.0.1", 9393], "9393" => [:tcp, "127.0.0.1", 9393],
      "0.0.0.0:9393" => [:tcp, "0.0.0.0", 9393], "unix:/tmp/s.sock" => [:unix, nil, "/tmp/s.sock"] }.each do |addr, want|
      assert_equal want, Blackbuck::Listeners.parse(addr, bare_host: "127.0.0.1"), addr
    end
    assert_equal [:tcp, "0.0.0.0", 9393], Blackbuck::Listeners.parse("9393")
  end

  def test_bad_forms
    ["", "host:", "a:b:c", "[::1]", "127.0.0.1:70000", "http://x:1"].each do |a|
      assert_raises(Blackbuck::ConfigError, a.inspect) { Blackbuck::Listeners.parse(a) }
    end
  end

  def test_server_starter_spec
    err = assert_raises(Blackbuck::ConfigError) { Blackbuck::Listeners.from_server_starter("0.0.0.0:80=x") }
    assert_match(/invalid SERVER_STARTER_PORT entry/, err.message)
    assert_equal [], Blackbuck::Listeners.inherited({ "SERVER_STARTER_PORT" => "" })
    assert_equal [], Blackbuck::Listeners.inherited({ "LISTEN_FDS" => "1", "LISTEN_PID" => "1" }), "not our pid"
  end
end

class ConfigTest < Minitest::Test
  def config = Blackbuck::Config.new

  def test_defaults_and_finalize
    c = config.finalize!({ "PORT" => "5000", "WEB_CONCURRENCY" => "3" })
    assert_equal ["0.0.0.0:5000"], c[:listen].map(&:address)
    assert_equal [false], c[:listen].map(&:proxy_protocol)
    assert_equal 3, c[:workers]
    assert_equal "development", c[:environment]
    assert_equal 75, c[:keepalive_timeout]
    c = config.finalize!({})
    assert_equal ["0.0.0.0:9292"], c[:listen].map(&:address)
    assert_equal Etc.nprocessors, c[:workers]
  end

  # What Rails' generated config/puma.rb and Kamal read from the environment, read the same way: the
  # file and the command line win; a blank variable is unset; a bad one names the variable.
  def test_rails_environment_variables
    c = config.finalize!({ "WEB_CONCURRENCY" => "auto", "RAILS_MAX_THREADS" => "3", "PIDFILE" => "/run/app.pid" })
    assert_equal Blackbuck::Config.cpus, c[:workers]
    assert_equal "$WEB_CONCURRENCY=auto", c.origin(:workers)
    assert_equal [3, "$RAILS_MAX_THREADS"], [c[:threads], c.origin(:threads)]
    assert_equal "/run/app.pid", c[:pid]
    c = config.set(:threads, 2).set(:workers, 5).set(:pid, "/x.pid")
              .finalize!({ "WEB_CONCURRENCY" => "auto", "RAILS_MAX_THREADS" => "3", "PIDFILE" => "/run/app.pid" })
    assert_equal [5, 2, "/x.pid", nil], [c[:workers], c[:threads], c[:pid], c.origin(:threads)]
    c = config.finalize!({ "WEB_CONCURRENCY" => " ", "RAILS_MAX_THREADS" => "", "PORT" => "" })
    assert_equal [Blackbuck::Config.cpus, 1, 9292], [c[:workers], c[:threads], c[:port]]
    {
      { "WEB_CONCURRENCY" => "many" } => "$WEB_CONCURRENCY must be an integer 1..4096 or auto, got \"many\"",
      { "WEB_CONCURRENCY" => "0" } => "$WEB_CONCURRENCY must be an integer 1..4096 or auto, got \"0\"",
      { "RAILS_MAX_THREADS" => "lots" } => "$RAILS_MAX_THREADS must be an integer 1..256, got \"lots\"",
      { "PORT" => "http" } => "$PORT must be an integer 0..65535, got \"http\""
    }.each do |env, message|
      err = assert_raises(Blackbuck::ConfigError) { config.finalize!(env) }
      assert_equal message, err.message
    end
  end

  # As `plugin :solid_queue if ENV["SOLID_QUEUE_IN_PUMA"]`: any value turns it on; the setting wins.
  def test_solid_queue_from_the_environment
    assert_equal false, config.finalize!({})[:solid_queue]
    c = config.finalize!({ "SOLID_QUEUE_IN_PUMA" => "1" })
    assert_equal [true, "$SOLID_QUEUE_IN_PUMA"], [c[:solid_queue], c.origin(:solid_queue)]
    assert_equal true, config.finalize!({ "SOLID_QUEUE_IN_PUMA" => "false" })[:solid_queue]
    assert_equal false, config.set(:solid_queue, false).finalize!({ "SOLID_QUEUE_IN_PUMA" => "1" })[:solid_queue]
    assert_equal true, config.set(:solid_queue, "true").finalize!({})[:solid_queue]
  end

  def test_restart_file_defaults_to_a_rails_apps_tmp_restart_txt
    Dir.mktmpdir do |dir|
      File.write("#{dir}/config.ru", "")
      assert_equal false, config.set(:rackup, "#{dir}/config.ru").finalize!({})[:restart_file]
      Dir.mkdir("#{dir}/tmp")
      assert_equal "#{dir}/tmp/restart.txt", config.set(:rackup, "#{dir}/config.ru").finalize!({})[:restart_file]
      assert_equal false, config.set(:rackup, "#{dir}/config.ru").set(:restart_file, false).finalize!({})[:restart_file]
      assert_equal false, config.set(:rackup, "#{dir}/config.ru").set(:restart_file, "off").finalize!({})[:restart_file]
      assert_equal "#{dir}/deploy/go", config.set(:rackup, "#{dir}/config.ru").set(:restart_file, "deploy/go")
                                             .finalize!({})[:restart_file]
    end
  end

  def test_validation_names_the_setting
    {
      [:workers, "0"] => /workers must be an integer 1\.\.4096/,
      [:timeout, "soon"] => /timeout must be a positive number of seconds/,
      [:handoff_after, "-1"] => /handoff_after must be a non-negative number of seconds/,
      [:keepalive, "maybe"] => /keepalive must be true or false/,
      [:unix_socket_mode, "999"] => /unix_socket_mode must be an octal file mode/,
      [:max_headers, 5000] => /max_headers must be an integer 1\.\.1000/,
      [:before_fork, 3] => /before_fork must be a block or a Proc/,
      [:after_refork, nil] => /after_refork must be a block or a Proc/,
      [:nonsense, 1] => /unknown setting nonsense/
    }.each do |(k, v), pattern|
      err = assert_raises(Blackbuck::ConfigError) { config.set(k, v) }
      assert_match pattern, err.message
    end
  end

  def test_values_are_converted
    c = config
    c.set(:timeout, "1.5").set(:workers, "4").set(:unix_socket_mode, "0660").set(:keepalive, "false")
    assert_equal 1.5, c[:timeout]
    assert_equal 4, c[:workers]
    assert_equal 0o660, c[:unix_socket_mode]
    assert_equal false, c[:keepalive]
    assert_equal 2, config.set(:timeout, "2")[:timeout]
  end

  # Issue 22: no request timeout in development unless one is set (a developer at a `debugger`
  # prompt kept losing the worker after 60 s); elsewhere Config::REQUEST_TIMEOUT. 0 is off anywhere.
  def test_timeout_is_off_in_development_unless_set
    assert_equal 0, config.finalize!({})[:timeout], "development, the default environment"
    assert_equal 0, config.finalize!({ "RACK_ENV" => "development" })[:timeout]
    assert_equal 60, config.finalize!({ "RACK_ENV" => "production" })[:timeout]
    assert_equal 60, config.finalize!({ "RAILS_ENV" => "staging" })[:timeout]
    assert_equal 60, config.set(:environment, "production").finalize!({})[:timeout], "-E production"
    assert_equal 5, config.set(:timeout, "5").finalize!({})[:timeout], "given (-t, -O Timeout=): applies in development"
    assert_equal 60, config.set(:timeout, 60).finalize!({})[:timeout], "60 given in development is 60"
    assert_equal 0, config.set(:timeout, "0").finalize!({ "RACK_ENV" => "production" })[:timeout], "0: off anywhere"
    Dir.mktmpdir do |d|
      File.write("#{d}/conf.rb", "timeout 30\n")
      assert_equal 30, Blackbuck::Config::DSL.load(config, "#{d}/conf.rb").finalize!({})[:timeout], "config file"
    end
    err = assert_raises(Blackbuck::ConfigError) { config.set(:timeout, "-1") }
    assert_equal 'timeout must be a positive number of seconds (0: off), got "-1"', err.message
  end

  def test_response_buffering_settings
    c = config
    assert_equal 1024 * 1024, c[:response_buffer]
    assert_equal 1024 * 1024 * 1024, c[:max_response_spill]
    assert_equal 4 * 1024 * 1024 * 1024, c[:max_worker_spill]
    c.set(:response_buffer, "65536").set(:max_response_spill, "0").set(:max_worker_spill, "1048576")
    assert_equal [65_536, 0, 1_048_576], [c[:response_buffer], c[:max_response_spill], c[:max_worker_spill]]
    Dir.mktmpdir do |d|
      File.write("#{d}/conf.rb", "response_buffer 4 * 1024 * 1024\nmax_response_spill 8 * 1024 * 1024\n")
      c = Blackbuck::Config::DSL.load(config, "#{d}/conf.rb")
      assert_equal [4 * 1024 * 1024, 8 * 1024 * 1024], [c[:response_buffer], c[:max_response_spill]]
    end
    { response_buffer: "-1", max_response_spill: "lots", max_worker_spill: "-5" }.each do |k, v|
      err = assert_raises(Blackbuck::ConfigError) { config.set(k, v) }
      assert_match(/\A#{k} must be an integer >= 0, got #{v.inspect}/, err.message)
    end
  end

  def test_unix_socket_group_takes_a_name_or_a_gid
    group = Etc.getgrgid(Process.egid)
    assert_nil config[:unix_socket_group]
    assert_equal group.gid, config.set(:unix_socket_group, group.name)[:unix_socket_group]
    assert_equal 4242, config.set(:unix_socket_group, "4242")[:unix_socket_group], "a gid need not have a name"
    assert_equal 0, config.set(:unix_socket_group, 0)[:unix_socket_group]
    {
      "no-such-group-bb" => /\Aunix_socket_group: no group named "no-such-group-bb"\z/,
      "" => /\Aunix_socket_group must be a group name or a numeric gid, got ""\z/,
      "-1" => /\Aunix_socket_group: no group named "-1"\z/,
      :www => /\Aunix_socket_group must be a group name or a numeric gid, got :www\z/
    }.each do |value, pattern|
      err = assert_raises(Blackbuck::ConfigError, value.inspect) { config.set(:unix_socket_group, value) }
      assert_match pattern, err.message
    end
  end

  def test_x_sendfile_and_x_accel_mapping
    c = config
    assert_equal [false, []], [c[:x_sendfile], c[:x_accel_mapping]], "off by default"
    c.set(:x_sendfile, "true").set(:x_accel_mapping, "/files=/srv/files").set(:x_accel_mapping, ["/a/=/srv/a/"])
    assert c[:x_sendfile]
    assert_equal [["/files/", "/srv/files"], ["/a/", "/srv/a/"]], c[:x_accel_mapping], "repeatable; prefixes end in /"
    assert_equal [], config[:x_accel_mapping], "each Config has its own list"
    Dir.mktmpdir do |d|
      File.write("#{d}/conf.rb", "x_sendfile true\nx_accel_mapping '/p/=/srv/p'\nx_accel_mapping '/q/=/srv/q'\n")
      c = Blackbuck::Config::DSL.load(config, "#{d}/conf.rb")
      assert_equal [true, [["/p/", "/srv/p"], ["/q/", "/srv/q"]]], [c[:x_sendfile], c[:x_accel_mapping]]
    end
    ["files=/srv", "/files=srv", "/files", "=/srv", 3, "/f=/srv\0"].each do |v|
      err = assert_raises(Blackbuck::ConfigError) { config.set(:x_accel_mapping, v) }
      assert_match(/\Ax_accel_mapping must be URI_PREFIX=DIRECTORY, both starting with \/, got /, err.message)
    end
  end

  def test_listen_entries_and_proxy_protocol
    c = config.set(:listen_one, "127.0.0.1:1").set(:listen_one, Blackbuck::Config::Listen.new("unix:/a.sock", "yes"))
    assert_equal [["127.0.0.1:1", false], ["unix:/a.sock", true]], c[:listen].map(&:to_a)
    assert c[:listen].all?(&:frozen?)
    assert_equal "127.0.0.1:1 unix:/a.sock", c[:listen].join(" "), "an entry reads as its address"
    Dir.mktmpdir do |d|
      File.write("#{d}/conf.rb", "listen '127.0.0.1:8080'\nlisten '[::1]:8080', 'unix:/lb.sock', proxy_protocol: true\n")
      c = Blackbuck::Config::DSL.load(config, "#{d}/conf.rb")
      assert_equal [["127.0.0.1:8080", false], ["[::1]:8080", true], ["unix:/lb.sock", true]], c[:listen].map(&:to_a)
      File.write("#{d}/conf.rb", "listen '127.0.0.1:8080', proxy_protocol: nil\n")
      err = assert_raises(Blackbuck::ConfigError) { Blackbuck::Config::DSL.load(config, "#{d}/conf.rb") }
      assert_equal "#{d}/conf.rb:1: proxy_protocol must be true or false, got nil", err.message
    end
    assert_equal [["a:1", false]], config.set(:listen, ["a:1"])[:listen].map(&:to_a), "set(:listen) takes Strings"
  end

  def test_listen_address_names_a_bound_socket
    tcp = Addrinfo.tcp("127.0.0.1", 8080)
    assert Blackbuck::Listeners.names?("127.0.0.1:8080", tcp)
    assert Blackbuck::Listeners.names?("localhost:8080", tcp), "a host name names what it resolves to"
    refute Blackbuck::Listeners.names?("127.0.0.1:8081", tcp)
    refute Blackbuck::Listeners.names?("127.0.0.2:8080", tcp)
    refute Blackbuck::Listeners.names?("unix:/a.sock", tcp)
    refute Blackbuck::Listeners.names?("not an address", tcp)
    assert Blackbuck::Listeners.names?("[::1]:8080", Addrinfo.tcp("::1", 8080))
    assert Blackbuck::Listeners.names?("unix:/tmp/a.sock", Addrinfo.unix("/tmp/a.sock"))
    refute Blackbuck::Listeners.names?("unix:/tmp/b.sock", Addrinfo.unix("/tmp/a.sock"))
  end

  # HUP re-exec: BLACKBUCK_LISTEN_FDS "fd:o|i" gained a third field "p" (PROXY protocol); the old
  # two-field form still reads as plain listeners.
  def test_reexec_hands_over_the_proxy_protocol_flag
    servers = Array.new(3) { TCPServer.new("127.0.0.1", 0) }
    # Each Listener takes over (and closes) a descriptor of its own: the dup's IO object gives it up
    # (left to the GC, it would close that number again, under whatever socket has it by then).
    fd = ->(i) { servers[i].dup.tap { |d| d.autoclose = false }.fileno }
    listeners = Blackbuck::Listeners
    bound = [listeners.from_fd(fd.call(0), inherited: false, proxy_protocol: true), listeners.from_fd(fd.call(1))]
    spec = nil
    Kernel.stub(:exec, ->(env, *) { spec = env[Blackbuck::Reexec::LISTEN_ENV] }) do
      Blackbuck::Reexec.stub(:command, ["ruby"]) { Blackbuck::Reexec.exec!(bound, []) }
    end
    assert_equal "#{bound[0].fd}:o:p,#{bound[1].fd}:i", spec
    fds = [0, 1, 2].map(&fd)
    env = { Blackbuck::Reexec::LISTEN_ENV => "#{fds[0]}:o:p,#{fds[1]}:i,#{fds[2]}:o" }
    handed = Blackbuck::Reexec.listeners(env)
    assert_equal [[fds[0], false, true], [fds[1], true, false], [fds[2], false, false]],
                 handed.map { |l| [l.fd, l.inherited?, l.proxy_protocol?] }
  ensure
    [*bound, *handed].each { |l| l.io.close }
    servers&.each(&:close)
  end

  def test_min_above_max_is_an_error
    c = config.set(:max_requests_per_child, 10).set(:min_requests_per_child, 20)
    assert_raises(Blackbuck::ConfigError) { c.finalize!({}) }
  end

  # A config file's error names the line that raised, also from inside a block or a method the
  # file defines; a misspelt directive gets the nearest one.
  def test_config_file_errors_name_the_line
    Dir.mktmpdir do |d|
      path = "#{d}/conf.rb"
      {
        "workers 2\n\nthreads 0\n" => "#{path}:3: threads must be an integer 1..256, got 0",
        "def setup\n  max_headers(0)\nend\nsetup\n" => "#{path}:2: max_headers must be an integer 1..1000, got 0",
        "[1].each do\n  backlogg 5\nend\n" => "#{path}:2: unknown directive backlogg (did you mean backlog?)",
        "workers 2\nfrobnicate 3\n" => "#{path}:2: unknown directive frobnicate",
        "x = nil\nx.fetch(1)\n" => "#{path}:2: NoMethodError: #{nil_fetch_message}"
      }.each do |source, message|
        File.write(path, source)
        err = assert_raises(Blackbuck::ConfigError, source) { Blackbuck::Config::DSL.load(config, path) }
        assert_equal message, err.message.lines.first.chomp, source
      end
    end
  end

  # oob_major_gc (issue 34): on where this Ruby's GC can leave major GCs to the worker (Ruby >= 3.4);
  # elsewhere `true` stops the boot with one line that says why, `false` is fine, and whatever the
  # Ruby a value that is no boolean is an error. The refusal is checked on every Ruby (a stand-in
  # probe) and, on a Ruby without the control, for real.
  def test_oob_major_gc_is_refused_where_the_gc_cannot_leave_majors_to_the_worker
    assert_equal false, config[:oob_major_gc], "off by default"
    err = assert_raises(Blackbuck::ConfigError) { config.set(:oob_major_gc, "maybe") }
    assert_equal 'oob_major_gc must be true or false, got "maybe"', err.message
    assert_equal false, config.set(:oob_major_gc, "off")[:oob_major_gc]
    refused = /\Aoob_major_gc needs GC\.config\(rgengc_allow_full_mark:\) \(Ruby >= 3\.4 with its default GC\); Ruby #{Regexp.escape(RUBY_VERSION)}.* has none: remove the setting/
    if Blackbuck::Memory.major_gc_control?
      assert_equal true, config.set(:oob_major_gc, "on")[:oob_major_gc]
      assert_equal true, config.set(:oob_major_gc, true)[:oob_major_gc]
    else
      err = assert_raises(Blackbuck::ConfigError) { config.set(:oob_major_gc, true) }
      assert_match refused, err.message
    end
    Blackbuck::Memory.stub(:major_gc_control?, false) do
      err = assert_raises(Blackbuck::ConfigError) { config.set(:oob_major_gc, "true") }
      assert_match refused, err.message
      assert_equal false, config.set(:oob_major_gc, false)[:oob_major_gc]
      Dir.mktmpdir do |d|
        File.write("#{d}/conf.rb", "workers 2\noob_major_gc true\n")
        err = assert_raises(Blackbuck::ConfigError) { Blackbuck::Config::DSL.load(config, "#{d}/conf.rb") }
        assert_match(/\A#{d}\/conf\.rb:2: oob_major_gc needs GC\.config/, err.message, "the config file's line")
      end
    end
  end

  private

  # Ruby's own words for nil.fetch (3.1: "undefined method `fetch' for nil:NilClass"; 3.4: "'fetch' for nil")
  def nil_fetch_message
    nil.fetch(1)
  rescue NoMethodError => e
    e.message.lines.first.chomp # 3.1: error_highlight adds the source line below
  end
end
