"""The slot manager and the wait queue (pure, time injected)."""
from __future__ import annotations

import pytest

from compute_node.slots import DRAINING, FREE, RESERVED, RESIDENT, QueueFull, SlotManager, WaitQueue

A, B, C = ("u", "a"), ("u", "b"), ("u", "c")


def test_free_slots_first_then_the_least_recently_used_resident():
    m = SlotManager(2)
    assert m.acquire(A, now=0).how == "free"
    m.finish(0, now=1, keep_resident=True)
    assert m.acquire(B, now=2).how == "free"
    m.finish(1, now=3, keep_resident=True)
    got = m.acquire(A, now=4)
    assert (got.slot, got.how) == (0, "resident")
    m.finish(0, now=5, keep_resident=True)
    got = m.acquire(C, now=6)  # evicts B (last used at 3), not A (5)
    assert (got.slot, got.how) == (1, "evicted") and m.evictions == 1
    assert m.resident_slot(B) is None and m.resident_slot(A) == 0


def test_a_reservation_is_taken_by_its_context_only_and_expires():
    m = SlotManager(1)
    got = m.reserve(A, now=0, lease_s=10)
    assert got.slot == 0 and m.slots[0].state == RESERVED
    assert not m.can_acquire(B)
    assert m.acquire(B, now=1) is None
    assert m.acquire(A, now=1, reserved=0).how == "reserved"
    m.release(0, now=2)
    m.reserve(A, now=3, lease_s=10)
    assert m.poll(now=20, counter_total=lambda c: 0, claimed=frozenset({(0, A)})) == []
    m.poll(now=12, counter_total=lambda c: 0)
    assert m.slots[0].state == RESERVED
    assert m.poll(now=13, counter_total=lambda c: 0) == [0]
    assert m.slots[0].state == FREE


def test_a_draining_slot_is_free_once_its_counter_reaches_the_target():
    m = SlotManager(1)
    m.acquire(A, now=0)
    m.drain(0, now=1, counter=5, target=3, timeout_s=60, reason="offload")
    assert m.slots[0].state == DRAINING and not m.can_acquire(B)
    assert m.poll(now=2, counter_total=lambda c: 2) == []
    assert m.poll(now=3, counter_total=lambda c: 3 if c == 5 else 0) == [0]
    m.acquire(A, now=4)
    m.drain(0, now=5, counter=5, target=99, timeout_s=10, reason="offload")
    assert m.poll(now=16, counter_total=lambda c: 0) == [0] and m.drain_timeouts == 1


def test_reserve_evicts_a_resident_slot_but_never_an_active_one():
    m = SlotManager(2)
    m.acquire(A, now=0)
    m.acquire(B, now=1)
    assert m.reserve(C, now=2, lease_s=5) is None
    m.finish(1, now=3, keep_resident=True)
    assert m.slots[1].state == RESIDENT
    assert m.reserve(C, now=4, lease_s=5).how == "evicted"


def test_the_queue_is_bounded_and_takes_the_first_runnable():
    q = WaitQueue(2)
    q.push("a")
    q.push("b")
    with pytest.raises(QueueFull, match="queue_bound 2"):
        q.push("c")
    assert q.take_first(lambda x: x == "b") == "b"
    assert q.take_first(lambda x: False) is None
    q.push_front("z")
    assert q.items() == ["z", "a"]
