"""Step 1's standing triggered PUTs: one per block of a registered pool, armed once, re-armed by the
NIC itself (pure: numpy over the region's counter array; no threads or I/O).

A block's entry fires when its PUT trigger counter holds a generation past the one it last fired
at (the compute node stores generations in increasing order, one store per block that filled);
firing re-arms it at that generation, so the compute node never arms, cancels or re-queues
anything. All of a pool's entries are checked at once: the trigger counters are one strided view
of the counter array, read as one bytes snapshot. A poll that finds it unchanged costs about a
microsecond; one that finds it changed locates the changed counters with integer operations on
the snapshots (their XOR's highest set bit, word by word), with no numpy call: between the rare
stores numpy's code leaves the CPU's caches, and a handful of cold numpy calls cost tens of µs.
"""
from __future__ import annotations

import numpy as np

from hostmem.kv_layout import KvLayout

_WORD_BITS = 64


class StandingPuts:
    """The standing PUT entries of one registered pool. Used by the watcher thread only."""

    def __init__(self, layout: KvLayout, counters: np.ndarray):
        self.layout = layout
        self.counters = counters  # [counter, success|error] uint64: the region's own array
        step, n = layout.counters_per_block, layout.num_blocks
        assert [layout.put_trigger(b) for b in (0, n - 1)] == [0, (n - 1) * step], "triggers are strided"
        self.triggers = counters[0:n * step:step, 0]  # [block] uint64: a view, read in place
        self._seen = self.triggers.tobytes()  # the triggers at the last call
        self._last = int.from_bytes(self._seen, "little")
        self.armed_at = memoryview(bytearray(self._seen)).cast("Q")  # [block]: fire when the trigger passes this

    def __len__(self) -> int:
        return len(self.armed_at)

    def due(self) -> list[tuple[int, int]]:
        """(block, generation) of every entry whose trigger moved past its arming; re-armed there."""
        seen = self.triggers.tobytes()
        if seen == self._seen:  # nothing stored since the last call: nothing newly due
            return []
        now = int.from_bytes(seen, "little")
        changed, self._seen, self._last = now ^ self._last, seen, now
        values, armed, due = memoryview(seen).cast("Q"), self.armed_at, []
        while changed:
            block = (changed.bit_length() - 1) // _WORD_BITS
            changed &= (1 << (block * _WORD_BITS)) - 1  # drop that word's bits
            if values[block] > armed[block]:
                armed[block] = values[block]
                due.append((block, values[block]))
        due.reverse()  # in block order
        return due
