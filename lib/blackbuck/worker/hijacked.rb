# frozen_string_literal: true

module Blackbuck
  # The sockets the app took over in this process (rack.hijack: WebSockets, Action Cable), held
  # weakly: one the app dropped is collected as usual. A worker that forks the mold (refork_after)
  # has the mold close its copies (.close_all), so the WebSockets stay the worker's alone and no
  # process the mold forks ever writes to one (closing a copy sends nothing to the client: the
  # worker still holds the socket).
  module Hijacked
    @ios = ObjectSpace::WeakMap.new
    @lock = Mutex.new # app threads hijack concurrently

    def self.add(io)
      @lock.synchronize { @ios[io] = true }
    end

    # Those the app has not closed.
    def self.open
      @lock.synchronize { @ios.keys.reject(&:closed?) }
    end

    # In the mold: closes this process's copy of each; returns how many.
    def self.close_all
      open.each do |io|
        io.close
      rescue IOError, SystemCallError
        nil
      end.size
    end
  end
end
