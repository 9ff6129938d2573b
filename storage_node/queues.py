"""Queue pairs: one submission/completion queue per connected host, with a depth and command ids."""
from __future__ import annotations

from collections import deque
from typing import Any

from fabric import status as st
from fabric.status import NvmeError


class QueuePair:
    """One host's I/O queue pair.

    Invariants: at most `depth` commands execute at once; a command id is unique among the
    queue's outstanding (executing or waiting) commands; waiting commands start in arrival
    order; completions may come in any order. `sq_head` counts commands fetched for execution,
    modulo depth, as NVMe's submission queue head pointer does. Not thread-safe: the fabric
    thread owns it.
    """

    def __init__(self, qid: int, depth: int = 128):
        if depth <= 0:
            raise ValueError(f"queue depth {depth} must be positive")
        self.qid = qid
        self.depth = depth
        self._running: set[int] = set()
        self._waiting: deque[tuple[int, Any]] = deque()
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
        """Queue a command; True when it may execute now, False when it waits for a free slot."""
        if cid in self._running or cid in self._waiting_ids:
            raise NvmeError(st.COMMAND_ID_CONFLICT, f"command id {cid} is already outstanding")
        if len(self._running) < self.depth and not self._waiting:
            self._running.add(cid)
            self._fetched += 1
            return True
        self._waiting.append((cid, item))
        self._waiting_ids.add(cid)
        return False

    def complete(self, cid: int) -> list[Any]:
        """Retire cid; return the waiting items that may execute now (in arrival order)."""
        self._running.remove(cid)
        started = []
        while self._waiting and len(self._running) < self.depth:
            next_cid, item = self._waiting.popleft()
            self._waiting_ids.discard(next_cid)
            self._running.add(next_cid)
            self._fetched += 1
            started.append(item)
        return started
