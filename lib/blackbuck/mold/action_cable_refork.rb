# frozen_string_literal: true

module Blackbuck
  # Action Cable in a mold a worker forked (refork_after). Action Cable builds its server's parts
  # once per process, on first use, and keeps them: the pub/sub adapter (Redis: a listener thread
  # on a subscribed connection; Solid Cable: a listener thread polling the database and a writer
  # thread), the event loop (a thread on an NIO selector, whose epoll descriptor a fork shares), the
  # heartbeat (a timer task whose next run was queued in the worker's timer thread) and the list of
  # open connections (WebSockets the worker took over: the mold closed its copies, Hijacked). A fork
  # copies all of it but the threads. The mold's workers would then subscribe on a listener that
  # never reads (the subscription is never confirmed), deliver no broadcast, never ping, and share
  # one selector. Dropped here, each worker the mold forks builds its own on first use, as a worker
  # forked from a master that never served does.
  #
  # Action Cable's own ActionCable.server.restart cannot be used in a fork: it closes each
  # connection (writing to a socket the mold has closed) and shuts the adapter down through the
  # threads the fork lost (Redis: an UNSUBSCRIBE on the connection the worker's thread reads; Solid
  # Cable: a semaphore the lost thread may hold, which waits for ever). Nothing is written or
  # waited on here: the objects are let go, and the GC (gc_before_fork) closes their descriptors in
  # the mold, so no worker inherits them.
  module ActionCableRefork
    # The server's parts built on first use (Action Cable 6.1 to 8.1 name them so): each is built
    # again on the next use when nil.
    LAZY_PARTS = %i[@pubsub @event_loop @worker_pool @heartbeat_timer].freeze

    # Whether there was an Action Cable server to reset (the log says so).
    def self.reset
      return false unless defined?(::ActionCable) && ::ActionCable.respond_to?(:server)

      server = ::ActionCable.server
      server.connections.clear if server.respond_to?(:connections)
      LAZY_PARTS.each do |part|
        server.instance_variable_set(part, nil) if server.instance_variable_defined?(part)
      end
      true
    end
  end
end
