"""hostmem._trigger: one step's records and triggers in one C call, held to the Python writer's bytes
(hostmem.descriptor.Writer and compute_node.offload's Python path) on real regions."""
import random
import uuid

import pytest

from compute_node.kv_pool import KvPool
from compute_node.offload import Block, OffloadStats, TriggeredOffload
from hostmem import descriptor
from hostmem.kv_layout import DESCRIPTOR_BYTES, KvLayout

_trigger = pytest.importorskip("hostmem._trigger")
L = KvLayout(num_blocks=8, num_layers=2, num_kv_heads=1, block_tokens=4, head_dim=2, layer_groups=2)


@pytest.fixture
def pools():
    made = [KvPool.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", L) for _ in range(2)]
    yield made
    for pool in made:
        pool.close()


def _records(pool, blocks):
    """Each block's record without its stamp (the one field the two writers cannot share)."""
    out = []
    for b in blocks:
        record = bytearray(pool.region.view(*L.descriptor_range(b)))
        record[descriptor.STAMP_OFFSET:descriptor.CRC_OFFSET] = bytes(8)
        out.append(bytes(record))
    return out


def _random_blocks(rng, ids):
    return [Block(b, i, rng.randint(1, 4), rng.randbytes(16), rng.randbytes(16) if i else b"",
                  rng.choice(["default", "t" * 64]), rng.choice(["alice", "ü" * 40]), f"c{rng.randint(0, 9)}",
                  rng.random() < 0.5) for i, b in enumerate(ids)]


def test_the_c_batch_writes_the_python_writers_bytes_and_stores_the_same_counters(pools):
    rng = random.Random(7)
    python, compiled = (TriggeredOffload(p, drain_timeout_s=5.0, compiled=c) for p, c in zip(pools, (False, True)))
    for pool in pools:
        pool.region.add_counter(L.put_done(5), success=4, error=1)
    for round_ in range(3):  # generations move on: each round's records carry the next
        ids = rng.sample(range(L.num_blocks), 5)
        blocks = _random_blocks(rng, ids)
        puts = [o.store_many(blocks, [OffloadStats() for _ in blocks]) for o in (python, compiled)]
        assert puts[0] == [p._replace(deadline=q.deadline) for p, q in zip(puts[1], puts[0])]
        assert _records(pools[0], ids) == _records(pools[1], ids)
        assert [pools[0].read_counter(L.put_trigger(b)) for b in ids] == \
            [pools[1].read_counter(L.put_trigger(b)) for b in ids]
        for b, block in zip(ids, blocks):
            d = descriptor.decode(pools[1].region.view(*L.descriptor_range(b)), L.block_tokens)
            assert (d.hash, d.parent, d.user, d.shared) == (block.hash, block.parent, block.user, block.shared)
            assert d.generation == pools[1].read_counter(L.put_trigger(b))[0] and d.stamp_ns > 0


def test_a_bad_block_in_a_batch_writes_nothing(pools):
    pool = pools[0]
    offload = TriggeredOffload(pool, drain_timeout_s=5.0, compiled=True)
    before = bytes(pool.region.buffer)
    good = Block(1, 0, 4, b"h" * 16, b"", "default", "alice", "c1")
    for bad, match in ((good._replace(block_id=L.num_blocks), "out of range"), (good._replace(hash=b"short"), "16 bytes"),
                       (good._replace(parent=b"p" * 15), "parent"), (good._replace(token_count=0), "token count")):
        with pytest.raises(ValueError, match=match):
            offload.store_many([good, bad], [OffloadStats(), OffloadStats()])
        assert bytes(pool.region.buffer) == before  # the good block was not written either


def test_the_call_refuses_a_layout_past_the_region(pools):
    pool = pools[0]
    size = len(pool.region.buffer)
    with pytest.raises(ValueError, match="pass the region"):
        _trigger.store(pool.region.buffer, size - DESCRIPTOR_BYTES, L.counter_offset, L.counters_per_block, 2, [])
    with pytest.raises(ValueError, match="pass the region"):
        _trigger.store(pool.region.buffer, L.descriptor_offset, size, L.counters_per_block, 1, [])
    huge = Block(1 << 40, 0, 4, b"h" * 16, b"", "default", "alice", "c1")
    owner = descriptor.owner("default", "alice", "c1")
    for num_blocks, per_block in ((1 << 61, L.counters_per_block), (2, 1 << 62)):  # products that wrap in 64 bits
        with pytest.raises(ValueError, match="pass the region"):
            _trigger.store(pool.region.buffer, L.descriptor_offset, L.counter_offset, per_block, num_blocks,
                           [(huge.block_id, 0, 4, huge.hash, b"", owner, False)])
    with pytest.raises(TypeError):
        _trigger.store(bytes(16), 0, 0, 2, 0, [])  # read-only
