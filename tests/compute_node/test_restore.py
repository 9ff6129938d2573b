"""The layer-group counter protocol of a restore, its join, its decision and the forward's bounded wait (pure)."""
from __future__ import annotations

import numpy as np
import pytest

from compute_node import restore as rs

GROUPS = 3


def pending(blocks: int = 3, tokens: int = 8, deadline: float = 100.0, bases=None) -> rs.PendingRestore:
    bases = bases or [(5, 1)] * GROUPS
    return rs.PendingRestore([rs.BlockRestore(i, 10 + i, bytes([i]) * 16, tokens,
                                              tuple(100 + i * GROUPS + g for g in range(GROUPS)), tuple(bases))
                              for i in range(blocks)], 0, blocks * tokens, 0, deadline)


class Counters:
    """A pool's counters: (success, error) rows."""

    def __init__(self, p: rs.PendingRestore):
        self.rows = {c: list(base) for b in p.blocks for c, base in zip(b.counters, b.bases)}

    def land(self, p, block: int, group: int, ok: bool = True) -> None:
        self.rows[p.blocks[block].counters[group]][0 if ok else 1] += 1

    def read(self, counters) -> np.ndarray:
        return np.asarray([self.rows[c] for c in counters], dtype=np.uint64)

    def read_counter(self, c) -> tuple[int, int]:
        return tuple(self.rows[c])


def test_groups_count_as_landed_in_order_and_only_in_every_block():
    p = pending()
    c = Counters(p)
    assert p.landed_groups(c.read(p.counters)) == 0 and not p.complete(c.read(p.counters))
    for b in range(3):
        c.land(p, b, 0)
    c.land(p, 0, 2)  # a later group of one block does not make a landed group
    rows = c.read(p.counters)
    assert p.landed_groups(rows) == p.usable_groups(rows) == 1
    assert p.landed(rows).tolist() == [[True, False, True], [True, False, False], [True, False, False]]
    c.land(p, 0, 1)
    c.land(p, 1, 1, ok=False)
    c.land(p, 2, 1)
    rows = c.read(p.counters)
    assert p.landed_groups(rows) == 2 and p.usable_groups(rows) == 1  # landed, but with an error in block 1
    assert p.errors(rows)[:, 1].tolist() == [False, True, False]
    for b in (1, 2):
        c.land(p, b, 2)
    assert p.complete(c.read(p.counters)) and p.landed_groups(c.read(p.counters)) == GROUPS


def ids_of(stored: dict):
    return lambda block: stored[block.block_id]


def test_a_sequence_joins_once_group_0_landed_well_with_the_token_ids_asked_for():
    p = pending()
    c = Counters(p)
    tokens = list(range(100, 130))
    good = {10 + i: np.asarray(tokens[i * 8:(i + 1) * 8], np.uint32) for i in range(3)}
    for b in range(2):
        c.land(p, b, 0)
    assert rs.join(p, c.read(p.counters), ids_of(good), tokens) is None  # block 2's group 0 not there yet
    c.land(p, 2, 0)
    assert rs.join(p, c.read(p.counters), ids_of(good), tokens) == rs.RestoreOutcome(24, 3, 0)
    other = {**good, 11: good[11] + 1}
    assert rs.join(p, c.read(p.counters), ids_of(other), tokens) is None  # another conversation's tokens
    q = pending()
    d = Counters(q)
    d.land(q, 0, 0)
    d.land(q, 1, 0, ok=False)
    d.land(q, 2, 0)
    assert rs.join(q, d.read(q.counters), ids_of(good), tokens) is None  # an error: decided as a whole later


def test_the_decision_keeps_the_blocks_before_the_first_that_failed():
    tokens = list(range(100, 130))
    good = {10 + i: np.asarray(tokens[i * 8:(i + 1) * 8], np.uint32) for i in range(3)}
    p = pending()
    c = Counters(p)
    for b in range(3):
        for g in range(GROUPS):
            c.land(p, b, g, ok=not (b == 1 and g == 2))
    out = rs.decide(p, c.read_counter, ids_of(good), tokens)
    assert (out.covered, out.blocks_ok, out.blocks_failed) == (8, 1, 2) and "block 1 ended with an error" in out.reason
    q = pending()
    d = Counters(q)
    for b in range(3):
        for g in range(GROUPS if b != 2 else 2):  # block 2's last group never came: not used
            d.land(q, b, g)
    out = rs.decide(q, d.read_counter, ids_of(good), tokens)
    assert (out.covered, out.blocks_ok) == (16, 2) and "timed out: block 2" in out.reason


class Clock:
    def __init__(self):
        self.now = 0.0
        self.on_sleep = []

    def sleep(self, s: float) -> None:
        self.now += s
        for fn in list(self.on_sleep):
            fn(self.now)

    def __call__(self) -> float:
        return self.now


def test_the_forward_waits_before_each_later_group_until_it_landed_in_every_block():
    p = pending()
    c = Counters(p)
    for b in range(3):
        c.land(p, b, 0)
    clock = Clock()
    clock.on_sleep.append(lambda now: [c.land(p, b, 1) for b in range(3)] and clock.on_sleep.clear()
                          if now > 0.002 else None)
    wait = rs.LayerWait({7: p}, [(0, 2), (2, 4), (4, 6)], c.read, wait_s=1.0, clock=clock, sleep=clock.sleep, spin_s=0)
    for layer in range(2):
        wait.before_layer(layer)  # group 0 is in: no wait
    assert wait.waits == 0
    wait.before_layer(2)  # group 1's first layer: waits until it lands
    assert wait.waits == 1 and 0.002 < wait.waited_s < 0.01 and not wait.failed
    for b in range(3):
        c.land(p, b, 2, ok=b != 1)
    wait.before_layer(4)
    assert "block 1's layer group 2 ended with an error" in wait.failed[7]


def test_a_group_that_does_not_land_within_the_wait_gives_the_sequence_up_for_the_step():
    p, q = pending(), pending(deadline=0.05)
    cp, cq = Counters(p), Counters(q)
    clock = Clock()
    wait = rs.LayerWait({1: p, 2: q}, [(0, 1), (1, 2), (2, 3)], lambda cs: (cp if cs == p.counters else cq).read(cs),
                        wait_s=0.2, clock=clock, sleep=clock.sleep, spin_s=0)
    wait.before_layer(1)
    assert set(wait.failed) == {1, 2} and "had not landed" in wait.failed[1]
    assert 0.2 <= wait.waited_s < 0.21 and "0.05" in wait.failed[2]  # q: its deadline; p: the wait bound
    wait.before_layer(2)  # given up: no more waiting for them
    assert wait.waits == 1


@pytest.mark.parametrize("bases", [[(0, 0)] * GROUPS, [(2**40, 3)] * GROUPS])
def test_counters_compare_against_their_values_before_the_get(bases):
    p = pending(bases=bases)
    c = Counters(p)
    assert not p.landed(c.read(p.counters)).any()
    c.land(p, 0, 0, ok=False)
    assert p.landed(c.read(p.counters))[0, 0] and p.errors(c.read(p.counters))[0, 0]
