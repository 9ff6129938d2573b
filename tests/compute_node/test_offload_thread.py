"""The offload thread (compute_node.offload_thread): the triggered stores off the engine's thread.

The thread alone, with an offloader that records what it was given; then the engine with it (tiny
model, FakeNic): the chunks stored are those the engine's own thread stores, a store that raises
there leaves no block pinned and is counted, and the thread runs on the CPUs it is given.
"""
from __future__ import annotations

import os
import threading
import time

import pytest

from compute_node.offload import TriggeredOffload
from compute_node.offload_thread import OffloadThread
from tests.compute_node.conftest import run_turn
from tests.compute_node.test_engine import PROMPTS


class Recorder:
    """An offloader that answers each block with its id doubled, and notes the thread and its CPUs."""

    def __init__(self, fail_on: int | None = None, gate: threading.Event | None = None):
        self.calls, self.fail_on, self.gate = [], fail_on, gate

    def store_many(self, blocks, stats):
        if self.gate is not None:
            self.gate.wait(5)
        self.calls.append((list(blocks), list(stats), threading.current_thread().name, os.sched_getaffinity(0)))
        if self.fail_on in blocks:
            raise ValueError("no such block")
        return [b * 2 for b in blocks]


def taken(thread: OffloadThread, batches: int, timeout_s: float = 5.0) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < batches and time.monotonic() < deadline:
        out += thread.take()
        time.sleep(0.001)
    return out


def test_batches_come_back_in_order_with_their_puts_stored_on_the_thread():
    thread, rec = OffloadThread(), Recorder()
    try:
        thread.hand(rec, [1, 2])
        thread.hand(rec, [3])
        assert thread.pending == 2
        out = taken(thread, 2)
        assert [(s.blocks, s.puts, s.error) for s in out] == [([1, 2], [2, 4], None), ([3], [6], None)]
        assert thread.pending == 0
        assert all(name == "offload" and stats == [None] * len(blocks) for blocks, stats, name, _ in rec.calls)
        assert thread.stats.batches == 2 and thread.stats.blocks == 3 and thread.stats.failed == 0
    finally:
        thread.close()


def test_a_store_that_raises_comes_back_as_an_error_and_the_thread_goes_on():
    thread, rec = OffloadThread(), Recorder(fail_on=7)
    try:
        thread.hand(rec, [7, 8])
        thread.hand(rec, [9])
        first, second = taken(thread, 2)
        assert first.puts is None and isinstance(first.error, ValueError) and first.blocks == [7, 8]
        assert second.puts == [18] and thread.stats.failed == 1
    finally:
        thread.close()


def test_no_room_past_max_batches_and_room_again_once_taken():
    gate = threading.Event()
    thread, rec = OffloadThread(max_batches=2), Recorder(gate=gate)
    try:
        thread.hand(rec, [1])
        thread.hand(rec, [2])
        assert not thread.room
        with pytest.raises(RuntimeError, match="at most 2"):
            thread.hand(rec, [3])
        gate.set()
        assert len(taken(thread, 2)) == 2 and thread.room
    finally:
        gate.set()
        thread.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_the_thread_runs_on_the_cpus_it_is_given():
    cpu = max(os.sched_getaffinity(0))
    thread, rec = OffloadThread(str(cpu)), Recorder()
    try:
        thread.hand(rec, [1])
        taken(thread, 1)
        assert rec.calls[0][3] == {cpu}
        assert len(os.sched_getaffinity(0)) >= 2  # the caller's own set is untouched
    finally:
        thread.close()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="CPU list"):
        OffloadThread("x")
    with pytest.raises(ValueError, match="max_batches"):
        OffloadThread(max_batches=0)
    with pytest.raises(ValueError, match="nap_us"):
        OffloadThread(nap_us=-1)


def stored_after_turns(make_node, **settings) -> tuple[dict, list, object]:
    """Three turns' chunks and descriptors (full blocks and each turn's partial last one; the last turn
    under a tenant's shared prefix, whose first blocks are named under the tenant's salt)."""
    node = make_node(nic=True, **settings)
    for i, ids in enumerate(PROMPTS[3:6]):
        run_turn(node, ids, f"ctx-{i}", "triggered", n=24,
                 **({"tenant": "acme", "shared_prefix_tokens": 20} if i == 2 else {}))
    time.sleep(0.1)
    described = sorted((d.tenant, d.user, d.context, d.chunk_index, d.token_count, d.hash, d.parent, d.shared)
                       for d in node.nic.descriptors)
    assert any(d.shared for d in node.nic.descriptors) and any(d.token_count < 8 for d in node.nic.descriptors)
    return dict(node.nic.stored), described, node


def test_the_thread_stores_the_chunks_the_engine_thread_stores(make_node):
    handed, handed_described, node = stored_after_turns(make_node, offload_thread=True)
    assert node.engine.offloads.thread.stats.blocks >= len(handed) > 0
    own, own_described, other = stored_after_turns(make_node, offload_thread=False)
    assert other.engine.offloads.thread is None
    assert handed == own and handed_described == own_described


def test_a_store_that_raises_on_the_thread_leaves_nothing_pinned_and_is_counted(make_node, monkeypatch):
    node = make_node(nic=True, offload_thread=True)

    def broken(self, blocks, stats):
        if threading.current_thread().name == "offload":
            raise OSError("the region went away")
        return real(self, blocks, stats)
    real = TriggeredOffload.store_many
    monkeypatch.setattr(TriggeredOffload, "store_many", broken)
    tokens, record, _ = run_turn(node, PROMPTS[3], "ctx-broken", "triggered", n=24)
    assert len(tokens) == 24 and record.chunks_offloaded == 0
    engine = node.engine
    deadline = time.monotonic() + 5
    while engine.offloads.puts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.offloads.puts and engine.bm.num_pinned_blocks == 0
    assert engine.stats.totals["offload_thread_failures"] > 0 and not node.nic.stored



def test_a_napping_thread_finds_what_was_appended():
    thread, rec = OffloadThread(nap_us=200), Recorder()
    try:
        thread.hand(rec, [4])
        thread.hand(rec, [5, 6])
        assert [s.puts for s in taken(thread, 2)] == [[8], [10, 12]]
    finally:
        thread.close()
    assert not thread._thread.is_alive()


def test_a_napping_thread_on_the_engine_stores_the_same_chunks(make_node):
    napping, napping_described, node = stored_after_turns(make_node, offload_thread_nap_us=200)
    assert node.engine.offloads.thread.nap_s == 200e-6 and napping
    woken, woken_described, _ = stored_after_turns(make_node, offload_thread_nap_us=0)
    assert napping == woken and napping_described == woken_described


def test_an_idle_napping_thread_sleeps_until_a_hand_off_wakes_it(monkeypatch):
    from compute_node import offload_thread
    monkeypatch.setattr(offload_thread, "NAP_FOR_S", 0.05)
    thread, rec = OffloadThread(nap_us=200), Recorder()
    try:
        deadline = time.monotonic() + 5
        while not thread._asleep and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread._asleep  # stopped napping
        thread.hand(rec, [3])
        assert [s.puts for s in taken(thread, 1)] == [[6]]
    finally:
        thread.close()
    assert not thread._thread.is_alive()


def test_swap_outs_of_blocks_still_on_the_thread_keep_their_pins_until_the_put_ends(make_node, monkeypatch):
    """A slow offload thread: victims are swapped out while their blocks are handed over and not yet
    triggered; their pins wait for those PUTs, every reply is right and no block stays pinned."""
    from compute_node.offload_tracker import OffloadTracker
    from tests.compute_node.test_engine import alone, together
    prompts = [list(range(300 + 11 * i, 300 + 11 * i + 40)) for i in range(6)]
    solo = alone(make_node, prompts, pool_tokens=512)
    real_store, real_swap = TriggeredOffload.store_many, OffloadTracker.swap_out
    handed_at_swap = []

    def slow(self, blocks, stats):
        if threading.current_thread().name == "offload":
            time.sleep(0.02)
        return real_store(self, blocks, stats)

    def swap_out(self, state, swap):
        handed_at_swap.extend(i for i, b in state.storing.items() if self.puts[b].put is None)
        return real_swap(self, state, swap)
    monkeypatch.setattr(TriggeredOffload, "store_many", slow)
    monkeypatch.setattr(OffloadTracker, "swap_out", swap_out)
    node = make_node(nic=True, pool_tokens=16 * 8, preemption="swap")  # 16 blocks; each needs 7
    results = together(node, prompts, policy="triggered", n=12)
    assert [tokens for tokens, _, _ in results] == solo
    assert node.engine.snapshot()["preemptions"].get("swap", 0) > 0 and handed_at_swap
    deadline = time.monotonic() + 5
    while node.engine.offloads.puts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not node.engine.offloads.puts and node.engine.bm.num_pinned_blocks == 0
