# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/fault_load"

class FaultTest < ServerTest
  DOWNLOAD_BYTES = 10 * 1024 * 1024 # a slow reader's download (the apps' /download?bytes=N)
  # Bytes a second a slow reader takes them at. The general load's downloads last ~1.3 s: long
  # enough to be on their way when a fault strikes, short enough that a suite of loads stays quick.
  # stopping_download_test, which needs every download mid-way whenever its stop begins, reads at
  # SLOW_DOWNLOAD_RATE (stopping_download_test: 6 MiB, ~3 s a download).
  DOWNLOAD_RATE = 8_000_000
  SLOW_DOWNLOAD_RATE = 2_000_000

  def download_path(bytes = DOWNLOAD_BYTES) = "/download?bytes=#{bytes}"

  # Keep-alive clients over the UNIX socket, connection-per-request clients over TCP, and slow
  # readers downloading on keep-alive connections (TCP and UNIX in turn), which the apps the suite
  # runs answer at /download.
  def load_on(server, keepalive: 2, fresh: 2, path: "/", downloads: 2, rate: DOWNLOAD_RATE, bytes: DOWNLOAD_BYTES)
    clients = Array.new(keepalive) { |i| ["unix-ka-#{i}", -> { server.unix }, true, path] } +
              Array.new(fresh) { |i| ["tcp-#{i}", -> { server.tcp }, false, path] } +
              Array.new(downloads) do |i|
                unix = i.odd? && server.unix_path
                ["#{unix ? 'unix' : 'tcp'}-download-#{i}", unix ? -> { server.unix } : -> { server.tcp }, true,
                 download_path(bytes), rate]
              end
    (@loads ||= []) << FaultLoad.new(clients)
    @loads.last
  end

  def assert_nothing_lost(load, allowed: {})
    failures = load.failures.reject { |k, n| n.zero? || (allowed[k] && n <= allowed[k]) }
    assert_empty failures, "requests lost: #{load.summary}"
  end

  # A line count in the server's log.
  def log_count(server, pattern) = server.log.scan(pattern).size

  def wait_log(server, pattern, count = 1, timeout: 60)
    wait_for(timeout) { log_count(server, pattern) >= count }
  rescue RuntimeError
    flunk "#{pattern.inspect} seen #{log_count(server, pattern)} times, not #{count}, within #{timeout}s"
  end

  def teardown
    (@loads || []).each(&:stop)
    super
  end
end
