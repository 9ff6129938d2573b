"""Queue pairs: one submission/completion queue per connected host, with a depth and command ids.

A full queue never holds anyone else back: past `depth` executing commands a queue parks a bounded
number more (`park`, and node-wide `ParkBudget` bytes of payload), and refuses the next with
"command interrupted" (NVMe's generic 0x21, retryable: the host may send it again once one of its
commands completed). Nothing refused was executed or acknowledged.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any

from fabric import status as st
from fabric.status import NvmeError

PARK_BYTES = 256 << 20  # payload bytes parked commands may hold on one node, all queues together


class ParkBudget:
    """The payload bytes parked commands hold, node-wide, at most `limit`. Thread-safe."""

    def __init__(self, limit: int = PARK_BYTES):
        if limit < 0:
            raise ValueError(f"park budget {limit} must not be negative")
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


class QueuePair:
    """One host's I/O queue pair.

    Invariants: at most `depth` commands execute at once and at most `park` more wait (parked),
    their payloads within the node's ParkBudget; a command past that is refused with
    COMMAND_INTERRUPTED, and the queue is left as it was. A command id is unique among the queue's
    outstanding (executing or parked) commands; parked commands start in arrival order;
    completions may come in any order. `sq_head` counts commands fetched for execution, modulo
    depth, as NVMe's submission queue head pointer does. Not thread-safe: the fabric thread owns
    it (items() is read by the same thread's stall check).
    """

    def __init__(self, qid: int, depth: int = 128, park: int | None = None, budget: ParkBudget | None = None):
        if depth <= 0:
            raise ValueError(f"queue depth {depth} must be positive")
        park = depth if park is None else park
        if park < 0:
            raise ValueError(f"park {park} must not be negative")
        self.qid = qid
        self.depth = depth
        self.park = park
        self.budget = budget or ParkBudget()
        self.refused = 0  # commands refused because the queue was full
        self._running: dict[int, Any] = {}
        self._waiting: deque[tuple[int, Any, int]] = deque()  # (cid, item, payload bytes held)
        self._waiting_ids: set[int] = set()
        self._fetched = 0

    @property
    def sq_head(self) -> int:
        return self._fetched % self.depth

    @property
    def outstanding(self) -> int:
        return len(self._running) + len(self._waiting)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, cid: int, item: Any = None) -> bool:
        """Queue a command; True when it may execute now, False when it is parked for a free slot.

        Raises NvmeError COMMAND_ID_CONFLICT for an id already outstanding, COMMAND_INTERRUPTED
        when the queue is full (depth executing, park parked, or the node's park budget spent).
        """
        if cid in self._running or cid in self._waiting_ids:
            raise NvmeError(st.COMMAND_ID_CONFLICT, f"command id {cid} is already outstanding")
        if len(self._running) < self.depth and not self._waiting:
            self._running[cid] = item
            self._fetched += 1
            return True
        nbytes = int(getattr(item, "payload_bytes", 0) or 0)
        if len(self._waiting) >= self.park or not self.budget.take(nbytes):
            self.refused += 1
            why = (f"{len(self._waiting)} parked" if len(self._waiting) >= self.park else
                   f"the node's {self.budget.limit} bytes for parked payloads in use")
            raise NvmeError(st.COMMAND_INTERRUPTED, f"queue {self.qid} is full ({len(self._running)} executing of "
                                                    f"depth {self.depth}, {why}): send it again after a completion")
        self._waiting.append((cid, item, nbytes))
        self._waiting_ids.add(cid)
        return False

    def complete(self, cid: int) -> list[Any]:
        """Retire cid; return the parked items that may execute now (in arrival order)."""
        del self._running[cid]
        started = []
        while self._waiting and len(self._running) < self.depth:
            next_cid, item, nbytes = self._waiting.popleft()
            self._waiting_ids.discard(next_cid)
            self.budget.give(nbytes)
            self._running[next_cid] = item
            self._fetched += 1
            started.append(item)
        return started

    def items(self) -> list[tuple[int, Any, bool]]:
        """(cid, item, parked) of every outstanding command, executing ones first."""
        return [(cid, item, False) for cid, item in self._running.items()] + \
               [(cid, item, True) for cid, item, _ in self._waiting]
