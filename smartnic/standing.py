"""Step 1's standing triggered PUTs: one per block of a registered pool, armed once, re-armed by the
NIC itself (pure: numpy over the region's counter array; no threads or I/O).

A block's entry fires when its PUT trigger counter holds a generation past the one it last fired
at (the compute node stores generations in increasing order, one store per block that filled);
firing re-arms it at that generation, so the compute node never arms, cancels or re-queues
anything. All of a pool's entries are checked in one vectorised read of their counters.
"""
from __future__ import annotations

import numpy as np

from hostmem.kv_layout import KvLayout


class StandingPuts:
    """The standing PUT entries of one registered pool. Used by the watcher thread only."""

    def __init__(self, layout: KvLayout, counters: np.ndarray):
        self.layout = layout
        self.counters = counters  # [counter, success|error] uint64: the region's own array
        self.triggers = np.asarray([layout.put_trigger(b) for b in range(layout.num_blocks)], dtype=np.intp)
        self.armed_at = counters[self.triggers, 0].copy()  # fire when the trigger passes this

    def __len__(self) -> int:
        return len(self.triggers)

    def due(self) -> list[tuple[int, int]]:
        """(block, generation) of every entry whose trigger moved past its arming; re-armed there."""
        now = self.counters[self.triggers, 0]
        fired = np.flatnonzero(now > self.armed_at)
        if not fired.size:
            return []
        self.armed_at[fired] = now[fired]
        return list(zip(fired.tolist(), now[fired].tolist()))
