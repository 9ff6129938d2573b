"""A node whose pool holds bf16 or fp8 KV (tiny model, FakeNic): its blocks leave and come back bit for
bit, and a restored follow-up replies as a resident one in the same dtype."""
from __future__ import annotations

import time

import pytest

from tests.compute_node.conftest import run_turn
from tests.compute_node.test_engine import PROMPTS


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_a_narrow_pool_restores_bit_identical_and_replies_as_resident(make_node, dtype):
    ids = PROMPTS[5]
    resident = make_node(kv_dtype=dtype)
    assert resident.pool.kv.element_size() == {"bfloat16": 2, "float8_e4m3fn": 1}[dtype]
    first, _, _ = run_turn(resident, ids, "ctx")
    follow = ids + first + [7, 8, 9]
    expected, rec, _ = run_turn(resident, follow, "ctx")
    assert rec.kv_source == "resident"
    node = make_node(nic=True, kv_dtype=dtype)
    assert run_turn(node, ids, "ctx", "triggered")[0] == first
    time.sleep(0.05)
    stored = dict(node.nic.stored)
    got, rec2, restores = run_turn(node, follow, "ctx", "triggered")
    assert rec2.kv_source == "restored", rec2.fallback_reason
    assert got == expected
    L = node.pool.layout
    for block in restores[0].blocks:
        assert bytes(node.pool.region.view(*L.block_range(block.block))) == stored[block.hash][1]
