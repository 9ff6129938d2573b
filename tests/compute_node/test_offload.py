"""The triggered offload's part on the compute node: a descriptor, one counter store, a doorbell rung only
when the agent's watcher sleeps (a real region; no agent)."""
import uuid

import pytest

from compute_node.kv_pool import KvPool
from compute_node.offload import Block, OffloadStats, TriggeredOffload
from hostmem import descriptor
from hostmem.bell import AWAKE, SLEEPING
from hostmem.kv_layout import KvLayout

L = KvLayout(num_blocks=4, num_layers=2, num_kv_heads=1, block_tokens=4, head_dim=2, layer_groups=2)
# both writers: hostmem._trigger's one call (where built) and the Python one
COMPILED = [False] + ([True] if descriptor.store_batch is not None else [])


@pytest.mark.parametrize("compiled", COMPILED)
def test_a_store_writes_the_descriptor_then_the_generation_and_rings_only_a_sleeping_watcher(compiled):
    pool = KvPool.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", L)
    try:
        offload, stats = TriggeredOffload(pool, drain_timeout_s=5.0, compiled=compiled), OffloadStats()
        assert offload.compiled == compiled
        pool.region.add_counter(L.put_done(2), success=3)
        block = Block(2, 1, 4, b"h" * 16, b"p" * 16, "default", "alice", "c1")
        put = offload.store(block, stats)
        assert pool.read_counter(L.put_trigger(2)) == (1, 0) and put.base == (3, 0)
        d = descriptor.decode(pool.region.view(*L.descriptor_range(2)), L.block_tokens)
        assert (d.generation, d.chunk_index, d.user, d.context, d.hash) == (1, 1, "alice", "c1", b"h" * 16)
        assert offload.bell.rings == 0 and stats.chunks == 1  # the watcher was not asleep: no system call
        offload.bell.word[0] = SLEEPING  # as the agent's watcher says before it sleeps
        offload.store(block, stats)
        assert pool.read_counter(L.put_trigger(2)) == (2, 0)
        assert offload.bell.rings == 1 and offload.bell.word[0] == AWAKE
        assert pool.region.counters[L.bell_counter, 0] == AWAKE  # the word is that counter's, in the region
    finally:
        pool.close()


@pytest.mark.parametrize("compiled", COMPILED)
def test_a_batch_describes_every_block_then_triggers_each_and_rings_once(compiled):
    pool = KvPool.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", L)
    try:
        offload = TriggeredOffload(pool, drain_timeout_s=5.0, compiled=compiled)
        offload.bell.word[0] = SLEEPING
        blocks = [Block(b, i, 4, bytes([b]) * 16, b"p" * 16 if i else b"", "default", "alice", "c1")
              for i, b in enumerate((3, 0, 2))]
        stats = [OffloadStats(), OffloadStats(), OffloadStats()]
        pool.region.add_counter(L.put_done(0), error=2)
        puts = offload.store_many(blocks, stats)
        assert [p.block_id for p in puts] == [3, 0, 2] and puts[1].base == (0, 2)
        assert [pool.read_counter(L.put_trigger(b)) for b in (3, 0, 2)] == [(1, 0)] * 3
        for i, b in enumerate((3, 0, 2)):
            d = descriptor.decode(pool.region.view(*L.descriptor_range(b)), L.block_tokens)
            assert (d.generation, d.chunk_index, d.hash) == (1, i, bytes([b]) * 16)
        assert offload.bell.rings == 1 and [s.chunks for s in stats] == [1, 1, 1]
        assert offload.store_many([], []) == [] and offload.bell.rings == 1  # nothing stored: no ring
    finally:
        pool.close()
