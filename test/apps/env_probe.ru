# frozen_string_literal: true

# What the app sees of the process environment (lifecycle tests): GET /ENV_NAME -> its value.
run ->(env) { [200, { "content-type" => "text/plain" }, [ENV[env["PATH_INFO"].delete_prefix("/")].inspect]] }
