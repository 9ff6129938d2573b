"""The fire ring (smartnic/fire_ring.h in smartnic/_poller.c): the poller's own native thread polls and
pushes each fire, the PUT path takes them without the GIL. Under stores from several threads at once,
every block's store is taken exactly once (none lost, none doubled), through a ring far smaller than the
burst; a stop with the ring full leaves the rest due for the next poll; take() times out and is
interrupted; bad calls are refused."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hostmem.bell import Bell
from hostmem.kv_layout import COUNTER_BYTES, KvLayout
from smartnic import standing

P = standing._poller
pytestmark = pytest.mark.skipif(P is None, reason="the compiled poller was not built")

BLOCKS = 2_000
L = KvLayout(num_blocks=BLOCKS, num_layers=1, num_kv_heads=1, block_tokens=4, head_dim=2)


def poller(blocks: int = BLOCKS):
    """A poller over a pool's counters (its triggers and its doorbell), as the agent makes one."""
    counters = np.zeros((L.counter_count, 2), np.uint64)
    return P.Poller(counters, 0, L.counters_per_block * COUNTER_BYTES, blocks, L.bell_counter * COUNTER_BYTES), counters


def store(counters: np.ndarray, block: int, generation: int) -> None:
    counters[L.put_trigger(block), 0] = generation


def take_all(p, want: int, timeout_s: float = 20.0, max_: int = 64, spin_ns: int = 0) -> list[tuple]:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += p.take(max_, 50_000_000, spin_ns)
    return got


@pytest.mark.parametrize("capacity", [4_096, 8])
def test_concurrent_stores_are_each_taken_once_none_lost_none_doubled(capacity):
    p, counters = poller()
    p.start_ring(capacity, 100_000, 5_000_000)
    try:
        def storer(blocks):
            for b in blocks:
                store(counters, b, 1)

        threads = [threading.Thread(target=storer, args=(range(k, BLOCKS, 3),)) for k in range(3)]
        for t in threads:
            t.start()
        got = take_all(p, BLOCKS, max_=7)
        for t in threads:
            t.join()
        time.sleep(0.05)
        got += p.take(64, 10_000_000)  # nothing more may come
    finally:
        p.stop_ring()
    blocks = [f[0] for f in got]
    assert sorted(blocks) == list(range(BLOCKS))  # every block once: none lost, none doubled
    assert all(f[1] == 1 and f[2] > 0 for f in got)
    assert p.ring_pushed == p.ring_taken == BLOCKS
    if capacity == 8:
        assert p.ring_full_waits > 0  # the burst outran the ring: the thread waited, dropped nothing


def test_a_block_stored_again_after_its_fire_fires_again_in_order():
    p, counters = poller()
    p.start_ring(64, 0, 2_000_000)
    try:
        seen = []
        for generation in range(1, 51):
            store(counters, 7, generation)
            seen += take_all(p, 1, timeout_s=5)
        assert [(f[0], f[1]) for f in seen] == [(7, g) for g in range(1, 51)]
    finally:
        p.stop_ring()


def test_a_stop_with_the_ring_full_leaves_what_was_not_pushed_due_for_the_next_poll():
    p, counters = poller()
    p.start_ring(4, 0, 2_000_000)
    for b in range(20):
        store(counters, b, 3)
    deadline = time.monotonic() + 5
    while p.ring_pushed < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.stop_ring()
    assert not p.ring_running and p.ring_pushed == 4
    taken = p.take(64, 0)
    polled = p.poll()  # the ring's thread is gone: poll() works again and finds the rest due
    assert sorted([f[0] for f in taken] + [f[0] for f in polled]) == list(range(20))
    assert p.poll() == []


def test_take_times_out_and_is_interrupted_and_the_thread_sleeps_on_the_bell():
    p, counters = poller()
    p.start_ring(16, 0, 1_000_000_000)
    try:
        start = time.monotonic()
        assert p.take(8, 30_000_000) == []
        assert 0.025 < time.monotonic() - start < 5
        threading.Timer(0.05, p.interrupt_take).start()
        start = time.monotonic()
        assert p.take(8, 10_000_000_000) == []  # ended by the interrupt, long before its timeout
        assert time.monotonic() - start < 5
        with pytest.raises(RuntimeError, match="waiting"):
            p.poll()  # the ring's thread polls: nobody else may
        time.sleep(0.05)
        store(counters, 3, 1)
        bell = Bell(L, counters)
        assert bell.ring()  # the thread sleeps on the doorbell (for up to 1 s): the compute node wakes it
        start = time.monotonic()
        assert [f[0] for f in take_all(p, 1, timeout_s=5)] == [3]
        assert time.monotonic() - start < 0.5
    finally:
        p.close()  # stops the ring's thread
    assert p.closed and not p.ring_running
    with pytest.raises(ValueError, match="closed"):
        p.take(8, 0)


def test_bad_calls_are_refused():
    p, _ = poller(4)
    with pytest.raises(ValueError, match="never started"):
        p.take(8, 0)
    for bad in [(0, 0, 1), (1 << 21, 0, 1), (8, -1, 1), (8, 0, 0)]:
        with pytest.raises(ValueError):
            p.start_ring(*bad)
    p.start_ring(8, 0, 1_000_000)
    try:
        with pytest.raises(RuntimeError):
            p.start_ring(8, 0, 1_000_000)  # one thread at a time
        with pytest.raises(RuntimeError):
            p.check_descriptors(None)
        for bad in [dict(max=0), dict(max=257), dict(timeout_ns=-1)]:
            with pytest.raises(ValueError):
                p.take(**bad)
    finally:
        p.stop_ring()
    p.stop_ring()  # twice is harmless
