# frozen_string_literal: true

require_relative "../lib/blackbuck_bench/server_ruby"

# Stand-ins for the servers' Ruby (BlackbuckBench::ServerRuby) built from facts, without running a
# Ruby: Debian's 3.1 (bin /usr/bin) and a 3.4 and 4.0 of our own. The plan's tests pin one, so they
# say the same whichever Ruby runs them.
module FakeRubies
  def self.ruby(version, bin: "/opt/rubies/#{version}/bin")
    BlackbuckBench::ServerRuby.new(bin, facts: { "version" => "#{version}.9", "abi" => "#{version}.0",
                                                 "gem_path" => ["/opt/gems/#{version}"], "description" => "ruby #{version}.9 (fake)" })
  end

  DEBIAN_31 = ruby("3.1", bin: "/usr/bin")
  RUBY_34 = ruby("3.4")
  RUBY_40 = ruby("4.0")

  # Runs the block with ServerRuby.current = ruby (the recipes' summaries and env read it).
  def with_server_ruby(ruby)
    saved = BlackbuckBench::ServerRuby.current
    BlackbuckBench::ServerRuby.current = ruby
    yield
  ensure
    BlackbuckBench::ServerRuby.current = saved
  end
end
