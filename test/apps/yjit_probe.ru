# frozen_string_literal: true

# Whether the worker runs YJIT: GET / -> "enabled=true" (yjit_test).
run lambda { |_env|
  [200, { "content-type" => "text/plain" }, ["enabled=#{defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?}"]]
}
