# frozen_string_literal: true

require "socket"

# The rooms a real Worker builds (Connections, its app runner, its Balancer), for the tests that
# check each reaches the Worker only through its narrow port (Connections::Port, AppRunner::Port,
# Balancer::Port): built, not run (no poller, no threads, no fork).
module WorkerRooms
  module_function

  # A Worker built for `threads` app threads, with or without a hand-off socket pair (closed by the
  # caller: the second value). Answers [worker, pair].
  def build(threads: 1, handoff: true)
    config = Blackbuck::Config.new.values.merge(threads: threads)
    pair = Socket.pair(:UNIX, :SEQPACKET) if handoff
    control, = IO.pipe
    logger = Blackbuck::Logger.new(File.open(File::NULL, "w"))
    worker = Blackbuck::Worker.new(index: 0, app: ->(_env) { [200, {}, []] }, config: config, listeners: [],
                                   control: control, scoreboard: Object.new, logger: logger, handoff: pair)
    [worker, pair]
  end

  # The room the worker holds in `ivar` (:@connections, :@runner, :@balancer).
  def room(worker, ivar) = worker.instance_variable_get(ivar)

  # Whether `target` can be reached from `object` through instance variables, Arrays, Hashes and
  # Structs: a room that can reach the Worker could call any of its methods. A Proc or a Method is
  # not followed: a port's callables may close over the Worker, and calling them is all a room can
  # do with them.
  def reaches?(object, target, seen = {}.compare_by_identity)
    return true if object.equal?(target)
    return false if seen[object] || object.is_a?(Proc) || object.is_a?(Method) || object.is_a?(Module)

    seen[object] = true
    children = case object
               when Array, Struct then object.to_a
               when Hash then object.keys + object.values
               else []
               end
    children += object.instance_variables.map { |iv| object.instance_variable_get(iv) }
    children.any? { |child| reaches?(child, target, seen) }
  end
end
