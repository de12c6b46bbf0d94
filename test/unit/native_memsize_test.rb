# frozen_string_literal: true

require "minitest/autorun"
require "blackbuck"
require "objspace"
require "socket"

# Every typed object of the C extension tells the GC its size (dsize), so ObjectSpace.memsize_of,
# memory profilers and the GC's malloc accounting see what it holds beside its heap slot.
class NativeMemsizeTest < Minitest::Test
  Native = Blackbuck::Native

  def setup
    Native.configure(Blackbuck::Config.new.values)
    @empty = ObjectSpace.memsize_of(Object.new) # a heap slot and nothing beside it
  end

  def test_the_scoreboard_counts_its_slots
    one = ObjectSpace.memsize_of(Native::Scoreboard.new(1))
    many = ObjectSpace.memsize_of(Native::Scoreboard.new(65))
    assert_operator one, :>, @empty
    assert_equal 0, (many - one) % 64, "64 more slots, each of the same size"
    assert_operator many - one, :>=, 64 * 8
  end

  def test_the_poller_and_the_hand_off_watcher_count_their_structs
    poller = Native::Poller.new(64)
    assert_operator ObjectSpace.memsize_of(poller), :>, @empty
    sender, receiver = Socket.pair(:UNIX, :SEQPACKET)
    handoff = Native::Handoff.new(poller, sender.fileno, 0, Native::Scoreboard.new(1))
    assert_operator ObjectSpace.memsize_of(handoff), :>, @empty
  ensure
    sender&.close
    receiver&.close
  end
end
