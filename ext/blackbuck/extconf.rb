# frozen_string_literal: true

require "mkmf"

# Probe features, never compare versions.
# epoll on Linux; elsewhere (macOS, BSD) Native::Poller falls back to poll(2).
# BLACKBUCK_FORCE_POLL=1 builds the fallback on Linux too, to test it.
have_header("sys/epoll.h") unless ENV["BLACKBUCK_FORCE_POLL"]
have_func("accept4", ["sys/types.h", "sys/socket.h"])
# Spilled responses are sent with sendfile(2) on Linux; elsewhere with pread + write.
have_header("sys/sendfile.h")
have_func("rb_enc_interned_str", "ruby.h")
have_func("rb_thread_call_without_gvl", "ruby/thread.h")
have_const("TCP_DEFER_ACCEPT", "netinet/tcp.h")
have_const("EPOLLEXCLUSIVE", "sys/epoll.h")
have_const("SCHED_BATCH", "sched.h") # Linux: workers run as batch tasks (Native.sched_batch)

$CFLAGS << " -std=gnu99 -O2 -Wall -Wextra -Wno-unused-parameter -fvisibility=hidden"
create_makefile("blackbuck/blackbuck_ext")
