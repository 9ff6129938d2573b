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
