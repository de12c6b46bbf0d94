# The seed hello world: no length given, so the server decides the framing.
run lambda { |_env| [200, {}, ["hello world\n"]] }
