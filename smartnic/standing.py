"""Step 1's standing triggered PUTs: one per block of a registered pool, armed once, re-armed by the
NIC itself.

A block's entry fires when its PUT trigger counter holds a generation past the one it last fired
at (the compute node stores generations in increasing order, one store per block that filled);
firing re-arms it at that generation, so the compute node never arms, cancels or re-queues
anything. All of a pool's entries are checked at once: the trigger counters are one strided view
of the counter array, read as one bytes snapshot. A poll that finds it unchanged costs about a
microsecond; one that finds it changed locates the changed counters with integer operations on
the snapshots (their XOR's highest set bit, word by word), with no numpy call: between the rare
stores numpy's code leaves the CPU's caches, and a handful of cold numpy calls cost tens of µs.

That poll is the watcher's, from Python (`fired`). Where the compiled poller was built
(smartnic/_poller.c), `start_compiled` hands the arming to it: `fired` is then its poll, and `wait`
polls back to back for a moment and then sleeps on the pool's doorbell (hostmem.bell) until the
compute node rings it, all without the GIL, so that between bursts of stores the watcher costs
neither a core nor a timer wake-up every few tens of microseconds.

The compiled poller can also check a fired block's descriptor itself, without the GIL, right where
it finds the store (`start_compiled(check=True)`, given the region's whole buffer as `region_array`):
the checks `Agent.block_put` makes in Python (hostmem.descriptor.decode, the trigger's generation,
a shared block full, the block's name over its token ids), refused for the same first reason.

Or the compiled poller polls on a native thread of its own (`start_ring`) and pushes each fire, its
descriptor checked, into a ring (smartnic/fire_ring.h) that the PUT path's thread drains with `take`,
without the GIL: no Python thread stands between the store and the thread that issues the PUT.

What `fired`, `wait` and `take` return, one tuple per fired block, in block order:
    from Python (not compiled):       (block, generation, None)
    compiled:                          (block, generation, seen_ns)
    compiled, check=True:              (block, generation, seen_ns, verdict, checked_ns)
seen_ns: CLOCK_MONOTONIC (time.monotonic_ns) right after the poll found the store; verdict: 0
(ACCEPTED) when the descriptor passed, else a code whose reason is VERDICTS[verdict] (the codes are
smartnic._poller's BAD_MAGIC, BAD_LENGTHS, BAD_CRC, BAD_TOKEN_COUNT, BAD_CHUNK_INDEX, GENERATION_ZERO,
BAD_PARENT, BAD_UTF8, STALE_GENERATION, SHARED_PARTIAL, BAD_HASH); checked_ns: CLOCK_MONOTONIC when
its check ended. `checking` says which shape a pool's fires have.
"""
from __future__ import annotations

import time

import numpy as np

from hostmem.kv_layout import COUNTER_BYTES, DESCRIPTOR_BYTES, TOKEN_ID_BYTES, KvLayout

try:
    from smartnic import _poller
except ImportError:  # not built (no C compiler, or not Linux): the watcher polls from Python
    _poller = None

ACCEPTED = 0
# verdict -> why the descriptor was refused (VERDICTS[0]: accepted); empty when not compiled
VERDICTS: tuple[str, ...] = _poller.VERDICTS if _poller is not None else ()

_WORD_BITS = 64


class StandingPuts:
    """The standing PUT entries of one registered pool. Used by the watcher thread only (interrupt() and
    close() from any thread)."""

    def __init__(self, layout: KvLayout, counters: np.ndarray, region_array=None):
        self.layout = layout
        self.counters = counters  # [counter, success|error] uint64: the region's own array
        self.region_array = region_array  # the whole region (its descriptors and token ids), or None
        step, n = layout.counters_per_block, layout.num_blocks
        if [layout.put_trigger(b) for b in (0, n - 1)] != [0, (n - 1) * step]:  # the view below reads them so
            raise ValueError(f"the layout's PUT triggers are not strided by {step} counters from 0")
        self.triggers = counters[0:n * step:step, 0]  # [block] uint64: a view, read in place
        self._seen = self.triggers.tobytes()  # the triggers at the last call
        self._last = int.from_bytes(self._seen, "little")
        self.armed_at = memoryview(bytearray(self._seen)).cast("Q")  # [block]: fire when the trigger passes this
        self.poller = None  # the compiled poller, once started: it holds the arming from then on
        self.closed = False

    def __len__(self) -> int:
        return len(self.armed_at)

    def start_compiled(self, check: bool = False) -> bool:
        """Hand the arming to the compiled poller, armed where this object's entries are armed now (a
        store made since the last `fired` fires from it); False when it was not built.
        check: the poller also checks each fired block's descriptor (the 5-tuples of the module's
        docstring); it needs `region_array`, whose counters must be `counters` (ValueError otherwise).
        A poller already started without checking starts checking."""
        if _poller is None or self.closed:
            return self.poller is not None
        if check:
            where = self._check_layout()  # before the poller exists: a bad layout starts nothing
        if self.poller is None:
            L = self.layout
            self.poller = _poller.Poller(self.counters, 0, L.counters_per_block * COUNTER_BYTES, L.num_blocks,
                                         L.bell_counter * COUNTER_BYTES, self.armed_at)
        if check and not self.poller.checking:
            self.poller.check_descriptors(self.region_array, *where)
        return True

    def _check_layout(self) -> tuple[int, int, int, int, int]:
        """(descriptor first, descriptor stride, ids first, ids stride, block_tokens) in region_array, once
        it is known to be the region whose counters the poller watches."""
        L = self.layout
        if self.region_array is None:
            raise ValueError("checking descriptors needs the region's buffer (region_array)")
        region = np.frombuffer(self.region_array, dtype=np.uint8)
        counters = self.counters
        if region.nbytes < L.region_bytes or counters.nbytes < L.counter_count * COUNTER_BYTES or \
                counters.ctypes.data != region.ctypes.data + L.counter_offset:
            raise ValueError(f"region_array ({region.nbytes} bytes) is not the region whose counters these "
                             f"are (a layout of {L.region_bytes} bytes, counters at {L.counter_offset})")
        d0, d1 = L.descriptor_range(0)[0], L.descriptor_range(min(1, L.num_blocks - 1))[0]
        i0, i1 = L.token_ids_range(0)[0], L.token_ids_range(min(1, L.num_blocks - 1))[0]
        ids_bytes = L.block_tokens * TOKEN_ID_BYTES
        return d0, max(d1 - d0, DESCRIPTOR_BYTES), i0, max(i1 - i0, ids_bytes), L.block_tokens

    @property
    def checking(self) -> bool:
        """Whether the compiled poller checks descriptors: fires are 5-tuples."""
        poller = self.poller
        return poller is not None and poller.checking

    def wait(self, spin_s: float, timeout_s: float, nap_s: float = 0.0, warm_s: float = 0.0) -> list[tuple[int, ...]]:
        """(compiled only) Without the GIL: poll back to back for spin_s, then (nap_s > 0, and less than
        warm_s since the last fire) nap nap_s at a time with the doorbell left awake, else sleep on the
        doorbell until the compute node rings it; until interrupt() or timeout_s. What fired (block,
        generation, seen ns), and when checking (verdict, checked ns) too."""
        return self.poller.wait(int(spin_s * 1e9), int(timeout_s * 1e9), int(nap_s * 1e9), int(warm_s * 1e9))

    def interrupt(self) -> None:
        """End a wait() now (any thread)."""
        poller = self.poller
        if poller is not None:
            poller.interrupt()

    def start_ring(self, spin_s: float, timeout_s: float, busy: bool = False) -> bool:
        """(compiled, checking) Hand the polling to the poller's own native thread, which pushes each fire
        into a ring of one slot per block for `take` (spin_s after a fire, or always when busy, then the
        doorbell or timeout_s); False when there is no checking poller."""
        poller = self.poller
        if poller is None or not poller.checking or self.closed:
            return False
        if not poller.ring_running:
            poller.start_ring(len(self), int(spin_s * 1e9), max(1, int(timeout_s * 1e9)), busy)
        return True

    @property
    def ring_running(self) -> bool:
        poller = self.poller
        return poller is not None and poller.ring_running

    def take(self, timeout_s: float, most: int = 64) -> list[tuple[int, ...]]:
        """(ring) Up to `most` fires from the ring, waiting without the GIL up to timeout_s for the first;
        [] at the timeout or interrupt_take(). ValueError once closed."""
        poller = self.poller
        if poller is None:
            raise ValueError("the pool's poller is closed")
        return poller.take(most, int(timeout_s * 1e9))

    def interrupt_take(self) -> None:
        """End a take() now (any thread)."""
        poller = self.poller
        if poller is not None:
            poller.interrupt_take()

    def close(self, timeout_s: float = 5.0) -> None:
        """Release the compiled poller, if any, once no wait() runs on it (the region may go away after
        this); nothing fires after. Any thread."""
        self.closed = True
        poller, self.poller = self.poller, None
        self.region_array = None  # no export of the region kept past its close
        if poller is None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            poller.interrupt()
            poller.interrupt_take()
            try:
                return poller.close()  # stops the ring's thread, if any
            except RuntimeError:  # the watcher is in wait(), or the PUT path in take(): it returns at the interrupt
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.0005)

    def fired(self) -> list[tuple[int, ...]]:
        """(block, generation, seen ns or None) of every entry whose trigger moved past its arming; when
        the compiled poller checks descriptors, (block, generation, seen ns, verdict, checked ns)."""
        poller = self.poller
        if poller is not None:
            return poller.poll()
        if self.closed:
            return []
        return [(block, generation, None) for block, generation in self._poll()]

    def _poll(self) -> list[tuple[int, int]]:
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
