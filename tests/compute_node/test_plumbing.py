"""Plumbing with a tiny Llama: the slot-backed cache, the pool layout, counters at chunk boundaries."""
from __future__ import annotations

import os

import numpy as np
import torch
from transformers import DynamicCache

from compute_node.kv_pool import KvPool, layout_for
from compute_node.slot_cache import SlotCache
from compute_node.turn import Turn
from compute_node.sampling import SamplingParams

from tests.compute_node.conftest import FakeAgent


def _pool(model, name, slots=2, tokens=128, chunk=8):
    return KvPool.create(f"kvtb-test-{name}-{os.getpid()}", layout_for(model.config, slots, tokens, chunk))


@torch.inference_mode()
def _greedy(model, cache, ids, steps):
    logits_seen, x = [], torch.tensor([ids])
    for _ in range(steps):
        logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits[0, -1]
        logits_seen.append(logits)
        x = torch.tensor([[int(logits.argmax())]])
    return logits_seen


def test_slot_cache_gives_the_same_logits_as_dynamic_cache(tiny_model):
    pool = _pool(tiny_model, "logits")
    try:
        ids = list(range(100, 130))
        expected = _greedy(tiny_model, DynamicCache(), ids, 12)
        got = _greedy(tiny_model, SlotCache(pool.slot_kv(1)), ids, 12)
        for a, b in zip(expected, got):
            assert torch.equal(a, b)
        # the keys the model cached are the slot's rows: 30 prompt tokens + 11 fed back
        layer0 = SlotCache(pool.slot_kv(1), length=41).layers[0]
        assert layer0.keys.shape == (1, 2, 41, 16)
        assert layer0.keys.data_ptr() == pool.kv[1, 0, 0].data_ptr()
    finally:
        pool.close()


def test_prefix_in_the_slot_is_reused_without_copy(tiny_model):
    pool = _pool(tiny_model, "prefix")
    try:
        ids = list(range(200, 240))
        full = _greedy(tiny_model, SlotCache(pool.slot_kv(0)), ids, 1)[0]
        # the first 32 tokens' KV is in the slot: prefill only the last 8
        resumed = _greedy(tiny_model, SlotCache(pool.slot_kv(0), length=32), ids[32:], 1)[0]
        assert torch.allclose(full, resumed, atol=1e-5)
    finally:
        pool.close()


def test_pool_layout_matches_its_shape_comment(tiny_model):
    pool = _pool(tiny_model, "layout", slots=3, tokens=64)
    try:
        L = pool.layout
        # kv: [slot, layer, K|V, kv_head, token, head_dim] fp32
        assert tuple(pool.kv.shape) == (3, L.num_layers, 2, L.num_kv_heads, 64, L.head_dim)
        for index in [(0, 0, 0, 0, 0), (2, 1, 1, 1, 63), (1, 0, 1, 0, 17)]:
            value = torch.arange(L.head_dim, dtype=torch.float32) + 1000 * sum(index)
            pool.kv[index] = value
            raw = np.frombuffer(pool.region.view(L.row_offset(*index), L.token_bytes), dtype="<f4")
            assert np.array_equal(raw, value.numpy())
        # token_ids: [slot, token] uint32
        pool.write_token_ids(2, 5, [7, 8, 9])
        offset, length = L.token_ids_range(2, 5, 8)
        assert np.frombuffer(pool.region.view(offset, length), dtype="<u4").tolist() == [7, 8, 9]
        pool.store_tokens(1, 42)
        assert pool.region.read_counter(L.token_counter(1)) == (42, 0)
    finally:
        pool.close()


def test_counters_are_stored_at_each_chunk_boundary(make_node):
    agent = FakeAgent()
    node = make_node(agent=agent, policy="triggered")
    pool, engine = node.engine.pool, node.engine
    stored = []
    real_store = pool.store_tokens
    pool.store_tokens = lambda slot, count: (stored.append(count), real_store(slot, count))
    ids = np.arange(300, 340, dtype=np.uint32)  # 40 tokens, chunk_tokens 8
    turn = Turn("r1", "u", "c", ids, 60, SamplingParams(), "triggered")
    engine.stop_token_ids = set()  # decode all 60 tokens
    engine.submit(turn)
    events = []
    while not events or events[-1][0] not in ("record", "error"):
        events.append(turn.events.get(timeout=30))
    record = events[-1][1]
    assert record.tokens_out == 60 and record.kv_source == "none"
    # begin: 0 in the slot; after prefill: 40; then every boundary; the end: 40 + 59 = 99
    assert stored == [0, 40, 48, 56, 64, 72, 80, 88, 96, 99]
    full = [op for op in agent.queued if op.put.chunk.token_end - op.put.chunk.token_start == 8]
    assert [op.threshold for op in full] == [8 * (i + 1) for i in range(12)]
    partial = agent.queued[-1]
    assert (partial.put.chunk.token_start, partial.put.chunk.token_end, partial.threshold) == (96, 99, 99)
    assert partial.put.slot == record.slot and not partial.put.ranges  # named in the registered layout
    assert record.chunks_offloaded == 13
    assert record.bytes_offloaded == 99 * (pool.layout.kv_bytes_per_token + 4)
    assert pool.read_counter(pool.layout.offload_counter(record.slot)) == (13, 0)
    assert {s.step for s in record.steps} == {2, 4}  # step 1 is the node's start, not a turn's
