"""The engine's step offloads its filled blocks as one batch; the chunks stored are those the per-block
path stores, and the PUT-done counters reaped in one vectorised read end the same PUTs as one by one
(tiny model, FakeNic)."""
from __future__ import annotations

import time

import pytest

from compute_node import offload_tracker
from compute_node.offload_tracker import OffloadTracker
from tests.compute_node.conftest import run_turn
from tests.compute_node.test_engine import PROMPTS


def per_block(self, filled):
    """The path before batching: each filled block described and stored on its own."""
    for state, index, block_id in filled:
        self.offload(state, index, block_id, self.layout.block_tokens)


def stored_after_turns(make_node) -> tuple[dict, list]:
    node = make_node(nic=True)
    for i, ids in enumerate(PROMPTS[3:6]):
        run_turn(node, ids, f"ctx-{i}", "triggered", n=24)
    time.sleep(0.1)
    described = sorted((d.user, d.context, d.chunk_index, d.token_count, d.hash) for d in node.nic.descriptors)
    return dict(node.nic.stored), described


@pytest.mark.parametrize("vector_min", [1, 10**6])
def test_the_batched_offload_stores_the_chunks_the_per_block_path_stores(make_node, monkeypatch, vector_min):
    monkeypatch.setattr(offload_tracker, "VECTOR_MIN", vector_min)  # the vectorised reap, and the scalar one
    batched, batched_described = stored_after_turns(make_node)
    monkeypatch.setattr(OffloadTracker, "offload_filled", per_block)
    single, single_described = stored_after_turns(make_node)
    assert batched and batched == single and batched_described == single_described
