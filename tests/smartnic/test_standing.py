"""Standing triggered PUTs: armed once, fired by a counter store, re-armed by themselves."""
import numpy as np

from hostmem.kv_layout import KvLayout
from smartnic.standing import StandingPuts

L = KvLayout(num_blocks=5, num_layers=2, num_kv_heads=1, block_tokens=4, head_dim=2)


def test_a_store_fires_its_block_once_and_the_entry_rearms_itself():
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    counters[L.put_trigger(1), 0] = 3  # generations stored before this agent armed: not due
    puts = StandingPuts(L, counters)
    assert len(puts) == 5 and puts.due() == []
    counters[L.put_trigger(1), 0] = 4
    counters[L.put_trigger(4), 0] = 1
    assert puts.due() == [(1, 4), (4, 1)]
    assert puts.due() == []  # fired once per store
    counters[L.put_trigger(1), 0] = 5
    assert puts.due() == [(1, 5)]


def test_each_new_generation_fires_again_and_nothing_else_does():
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts = StandingPuts(L, counters)
    for generation in range(1, 6):  # the agent re-arms after every fire: no call from the compute node
        counters[L.put_trigger(2), 0] = generation
        assert puts.due() == [(2, generation)]
        assert puts.due() == []
    counters[L.put_trigger(2), 0] = 3  # a store that goes back is not a new generation
    assert puts.due() == []
    counters[L.put_trigger(2), 0] = 5  # nor one back to where it fired
    assert puts.due() == []
    counters[L.put_trigger(2), 0] = 6
    assert puts.due() == [(2, 6)]
    for block in range(L.num_blocks):  # a whole step's blocks at once
        counters[L.put_trigger(block), 0] += 1
    assert puts.due() == [(0, 1), (1, 1), (2, 7), (3, 1), (4, 1)]
    counters[L.put_trigger(0), 0] = 2
    counters[L.put_trigger(0), 0] = 3  # two stores between polls: one fire, at the last generation
    assert puts.due() == [(0, 3)]


def test_other_counters_of_a_block_never_fire_it():
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts = StandingPuts(L, counters)
    counters[L.put_done(1), 0] = 9
    counters[L.get_done(1), 0] = 9
    counters[L.extra_counter(0), 0] = 9
    counters[L.put_trigger(1), 1] = 9  # the error part of a trigger is the agent's, not a store
    assert puts.due() == []
