"""The host swap tier (preemption swap-host): swap out, swap in, bit-equal KV; a tight pool gives the
replies an ample one gives; a full tier falls back to recompute and counts it."""
from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from compute_node.block_manager import BlockManager
from compute_node.host_swap import HostSwapStore, bytes_per_block, capacity_bytes
from compute_node.scheduler import Scheduler
from compute_node.sequence import Sequence, SequenceStatus
from compute_node.settings import ComputeSettings
from hostmem.kv_layout import KvLayout
from tests.compute_node.conftest import run_turn

PROMPTS = [list(range(300 + 11 * i, 300 + 11 * i + 40)) for i in range(6)]


# -- the store alone, over a region-like byte array

def _region(num_blocks=6, block_tokens=4):
    layout = KvLayout(num_blocks=num_blocks, num_layers=2, num_kv_heads=1, block_tokens=block_tokens, head_dim=4)
    array = np.zeros(layout.region_bytes, dtype=np.uint8)
    rng = np.random.default_rng(1)
    array[:layout.counter_offset] = rng.integers(0, 256, layout.counter_offset, dtype=np.uint8)
    return layout, array


def _block(layout, array, block_id):
    offset, length = layout.block_range(block_id)
    ids_offset, ids_length = layout.token_ids_range(block_id)
    return array[offset:offset + length].copy(), array[ids_offset:ids_offset + ids_length].copy()


def _write_ids(layout, array, block_id, ids):
    offset, _ = layout.token_ids_range(block_id)
    array[offset:offset + 4 * len(ids)] = np.asarray(ids, dtype="<u4").view(np.uint8)


def test_a_swapped_block_comes_back_bit_equal_in_another_pool_block():
    layout, array = _region()
    tokens = list(range(10, 20))  # 2.5 blocks of 4
    for i, block_id in enumerate((1, 3, 4)):
        _write_ids(layout, array, block_id, tokens[4 * i:4 * i + 4])
    before = [_block(layout, array, b) for b in (1, 3, 4)]
    store = HostSwapStore(layout, array, capacity_bytes(layout, 24))
    assert store.swap_out(7, [1, 3, 4]) == 3 * bytes_per_block(layout)
    assert store.used == 3 * bytes_per_block(layout) and 7 in store
    array[:layout.counter_offset] = 0  # the blocks are reused by others meanwhile
    got = store.swap_in(7, tokens, 0, 10, [0, 1, 2], [5, 0, 2])
    assert (got.covered, got.blocks, got.reason) == (10, 3, "")
    for (kv, ids), block_id in zip(before, (5, 0, 2)):
        kv2, ids2 = _block(layout, array, block_id)
        assert np.array_equal(kv, kv2) and np.array_equal(ids, ids2)
    assert store.used == 0 and 7 not in store
    assert store.stats.bytes_out == store.stats.bytes_in == 3 * bytes_per_block(layout)


def test_a_swap_in_after_a_prefix_hit_copies_only_the_rest():
    layout, array = _region()
    tokens = list(range(10, 22))
    for i, block_id in enumerate((0, 1, 2)):
        _write_ids(layout, array, block_id, tokens[4 * i:4 * i + 4])
    kv2, _ = _block(layout, array, 2)
    store = HostSwapStore(layout, array, capacity_bytes(layout, 24))
    store.swap_out(1, [0, 1, 2])
    got = store.swap_in(1, tokens, 8, 11, [2], [4])  # blocks 0 and 1 were found in the prefix cache
    assert (got.covered, got.blocks) == (11, 1) and np.array_equal(_block(layout, array, 4)[0], kv2)


def test_a_full_tier_keeps_nothing_and_counts_the_fallback():
    layout, array = _region()
    store = HostSwapStore(layout, array, capacity_bytes(layout, 8))  # two blocks
    assert store.swap_out(1, [0, 1, 2]) is None
    assert 1 not in store and store.used == 0 and store.stats.fallbacks == store.stats.full == 1
    assert store.swap_out(2, [0, 1]) is not None and not store.fits(1)


def test_a_doubtful_copy_stops_the_swap_in_there():
    layout, array = _region()
    tokens = list(range(10, 22))
    for i, block_id in enumerate((0, 1, 2)):
        _write_ids(layout, array, block_id, tokens[4 * i:4 * i + 4])
    store = HostSwapStore(layout, array, capacity_bytes(layout, 24))
    store.swap_out(1, [0, 1, 2])
    other = tokens[:4] + [99] + tokens[5:]  # block 1's ids differ from the sequence's
    got = store.swap_in(1, other, 0, 11, [0, 1, 2], [3, 4, 5])
    assert (got.covered, got.blocks) == (4, 1) and "other token ids" in got.reason
    assert store.stats.fallbacks == 1 and store.used == 0
    missing = store.swap_in(2, tokens, 0, 11, [0, 1, 2], [3, 4, 5])
    assert (missing.covered, missing.blocks) == (0, 0) and "no copy" in missing.reason


def test_discarded_copies_give_their_bytes_back():
    layout, array = _region()
    store = HostSwapStore(layout, array, capacity_bytes(layout, 24))
    store.swap_out(1, [0, 1])
    store.discard(1)
    store.discard(1)
    assert store.used == 0 and store.stats.discarded == 1


def test_capacity_is_whole_blocks_and_never_negative():
    layout, _ = _region()
    assert capacity_bytes(layout, 7) == bytes_per_block(layout)
    with pytest.raises(ValueError):
        capacity_bytes(layout, -1)


# -- settings and the scheduler

@pytest.mark.parametrize("fields", [{"preemption": "swap-disk"}, {"swap_space_tokens": -8},
                                    {"swap_space_tokens": 3, "block_tokens": 8}, {"swap_space_tokens": 8.5}])
def test_bad_swap_settings_raise_value_errors(fields):
    with pytest.raises(ValueError):
        ComputeSettings(**fields)


def test_swap_space_defaults_to_the_pools_size():
    s = ComputeSettings(pool_tokens=1024, block_tokens=16, preemption="swap-host")
    assert s.swap_space_blocks == 64
    assert ComputeSettings(pool_tokens=1024, block_tokens=16, swap_space_tokens=100).swap_space_blocks == 6


def test_a_swap_host_victim_frees_its_blocks_at_once_whatever_its_policy():
    bm = BlockManager(num_blocks=4, block_tokens=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, preemption="swap-host")
    a = Sequence(list(range(7)), 8, 4, can_swap=False)  # a policy that stores nothing
    b = Sequence(list(range(50, 57)), 8, 4, can_swap=False)
    for seq in (a, b):
        sched.add(seq)
    for _ in range(2):  # prefill, then a decode: 9 tokens each, 8 computed, 2 blocks each: the pool is full
        out = sched.schedule()
        sched.postprocess(out, [1, 2])
    out = sched.schedule()  # each decode needs a third block: b is preempted
    assert [(s.seq, s.kind) for s in out.swapped_out] == [(b, "swap-host")]
    [swap] = out.swapped_out
    assert swap.num_tokens == 8 and len(swap.block_ids) == 2 and b.status is SequenceStatus.SWAPPED
    assert b.kv_mark == 8 and not b.pinned_blocks and bm.num_pinned_free_blocks == 0
    assert [s.seq for s in out.scheduled] == [a] and not out.stalled  # no step waits for the copy
    sched.swap_failed(b)
    assert b.status is SequenceStatus.WAITING
    with pytest.raises(ValueError):
        sched.swap_failed(b)


# -- the engine

def alone(make_node, prompts, **kw):
    node = make_node(**kw)
    return [run_turn(node, ids, f"solo-{i}", n=12)[0] for i, ids in enumerate(prompts)]


def together(node, prompts, policy="resident", n=12):
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(run_turn, node, ids, f"c{i}", policy, n) for i, ids in enumerate(prompts)]
        return [f.result() for f in futures]


def _watch_copies(node):
    """Wrap the node's host tier: the pool's bytes of each victim's blocks as they were at swap-out, and
    as they are after its swap-in; [(block index, before, after)]."""
    store, pool = node.engine.preemption.host_swap, node.pool
    L = pool.layout
    saved, compared = {}, []

    def block_bytes(block_id):
        offset, length = L.block_range(block_id)
        ids_offset, ids_length = L.token_ids_range(block_id)
        return bytes(pool.region.view(offset, length)) + bytes(pool.region.view(ids_offset, ids_length))

    swap_out, swap_in = store.swap_out, store.swap_in

    def watched_out(seq_id, block_ids):
        saved[seq_id] = [block_bytes(b) for b in block_ids]
        return swap_out(seq_id, block_ids)

    def watched_in(seq_id, token_ids, first_token, num_tokens, block_indexes, block_ids):
        got = swap_in(seq_id, token_ids, first_token, num_tokens, block_indexes, block_ids)
        for index, block_id in list(zip(block_indexes, block_ids))[:got.blocks]:
            compared.append((index, saved[seq_id][index], block_bytes(block_id)))
        return got

    store.swap_out, store.swap_in = watched_out, watched_in
    return compared


@pytest.mark.parametrize("policy", ["resident", "triggered"])
def test_a_tight_pool_swaps_to_host_and_every_reply_is_the_unpreempted_one(make_node, policy):
    solo = alone(make_node, PROMPTS, pool_tokens=512)
    node = make_node(nic=True, pool_tokens=16 * 8, preemption="swap-host")  # 16 blocks; each needs 7
    compared = _watch_copies(node)
    results = together(node, PROMPTS, policy=policy)
    assert [tokens for tokens, _, _ in results] == solo
    snap = node.engine.snapshot()
    assert snap["preemptions"].get("swap-host", 0) > 0 and "swap" not in snap["preemptions"], snap
    assert snap["swap_host_bytes_out"] > 0 and snap["swap_host_bytes_in"] > 0
    assert snap["swap_host_fallbacks"] == 0 and snap["swap_host_used_bytes"] == 0
    assert snap["preempt_swap_out_s"] > 0 and snap["preempt_swap_in_s"] > 0 and snap["preempt_swap_wait_s"] == 0
    assert compared and all(before == after for _, before, after in compared)  # bit-equal, ids included
    # what came back was not prefilled again: only the blocks the prefix cache had lost meanwhile
    assert snap["preempt_recompute_tokens"] == 0
    assert sum(record.preemptions for _, record, _ in results) == sum(snap["preemptions"].values())


def test_a_full_host_tier_falls_back_to_recompute_and_counts_it(make_node):
    solo = alone(make_node, PROMPTS, pool_tokens=512)
    node = make_node(pool_tokens=16 * 8, preemption="swap-host", swap_space_tokens=8)  # one block: none fits
    results = together(node, PROMPTS)
    assert [tokens for tokens, _, _ in results] == solo
    snap = node.engine.snapshot()
    assert snap["preemptions"].get("swap-host", 0) > 0
    assert snap["swap_host_fallbacks"] == snap["preemptions"]["swap-host"] and snap["swap_host_bytes_out"] == 0
    assert snap["preempt_recompute_tokens"] > 0 and snap["preempt_recompute_s"] > 0


def test_recompute_preemptions_count_the_forward_time_spent_computing_again(make_node):
    node = make_node(pool_tokens=16 * 8, preemption="recompute")
    together(node, PROMPTS)
    snap = node.engine.snapshot()
    assert snap["preemptions"].get("recompute", 0) > 0
    assert snap["preempt_recompute_tokens"] > 0 and snap["preempt_recompute_s"] > 0
    assert snap["preempt_swap_s"] == 0 and snap["swap_host_bytes_out"] == 0


def test_the_stats_rpc_carries_the_preemption_counters(make_node):
    from kvtb_proto import compute_pb2
    node = make_node(pool_tokens=16 * 8, preemption="swap-host")
    together(node, PROMPTS[:4])
    stats = node.stub.Stats(compute_pb2.ComputeStatsRequest(), timeout=10)
    snap = node.engine.snapshot()
    assert stats.swap_host_bytes_out == snap["swap_host_bytes_out"]
    assert stats.swap_host_capacity_bytes == snap["swap_host_capacity_bytes"] > 0
    assert stats.preempt_swap_s == pytest.approx(snap["preempt_swap_s"])
