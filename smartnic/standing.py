"""Step 1's standing triggered PUTs: one per block of a registered pool, armed once, re-armed by the
NIC itself (pure: numpy over the region's counter array; no threads or I/O).

A block's entry fires when its PUT trigger counter holds a generation past the one it last fired
at (the compute node stores generations in increasing order, one store per block that filled);
firing re-arms it at that generation, so the compute node never arms, cancels or re-queues
anything. All of a pool's entries are checked at once: the trigger counters are one strided view
of the counter array, read as one bytes snapshot; only when it differs from the last one are they
compared with the arming values (a poll that finds nothing costs about a microsecond).
"""
from __future__ import annotations

import numpy as np

from hostmem.kv_layout import KvLayout


class StandingPuts:
    """The standing PUT entries of one registered pool. Used by the watcher thread only."""

    def __init__(self, layout: KvLayout, counters: np.ndarray):
        self.layout = layout
        self.counters = counters  # [counter, success|error] uint64: the region's own array
        step, n = layout.counters_per_block, layout.num_blocks
        assert [layout.put_trigger(b) for b in (0, n - 1)] == [0, (n - 1) * step], "triggers are strided"
        self.triggers = counters[0:n * step:step, 0]  # [block] uint64: a view, read in place
        self.armed_at = self.triggers.copy()  # fire when the trigger passes this
        self._seen = self.triggers.tobytes()  # the triggers at the last call
        self._moved = np.zeros(n, dtype=bool)

    def __len__(self) -> int:
        return len(self.armed_at)

    def due(self) -> list[tuple[int, int]]:
        """(block, generation) of every entry whose trigger moved past its arming; re-armed there."""
        seen = self.triggers.tobytes()
        if seen == self._seen:  # nothing stored since the last call: nothing newly due
            return []
        self._seen = seen
        now = np.frombuffer(seen, dtype=np.uint64)  # the values compared are the values remembered
        np.greater(now, self.armed_at, out=self._moved)
        fired = np.flatnonzero(self._moved)
        if not fired.size:
            return []
        now = now[fired]
        self.armed_at[fired] = now
        return list(zip(fired.tolist(), now.tolist()))
