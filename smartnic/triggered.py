"""The NIC's deferred work queue (libfabric fi_trigger semantics), pure: no I/O, no threads.

An entry is (trigger counter, threshold, operation, completion counter). It is due when the
trigger counter's success + error reaches the threshold (at once if that already holds when
it is queued). Due entries of one counter come out in threshold order, equal thresholds in
the order they were queued. Cancel drops every entry of one counter; flush drops all of them
(FI_FLUSH_WORK). The queue is bounded, like a Cassini service's limit on deferred work.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

DEFAULT_BOUND = 512


class QueueFull(Exception):
    """Queuing would pass the bound (the service answers RESOURCE_EXHAUSTED)."""


class CounterKey(NamedTuple):
    """A counter in a registered region."""

    region_id: int
    counter: int


@dataclasses.dataclass
class Entry:
    """One deferred operation; `op` is opaque to the queue."""

    op_id: int
    trigger: Hashable
    threshold: int
    op: Any
    completion: Hashable | None
    queued_at: float = 0.0


class DeferredWorkQueue:
    """Pending entries per trigger counter, each a heap ordered by (threshold, queue order).

    Not thread-safe: the engine serialises calls with its own lock.
    """

    def __init__(self, bound: int = DEFAULT_BOUND):
        if bound <= 0:
            raise ValueError(f"bound must be positive, got {bound}")
        self.bound = bound
        self._heaps: dict[Hashable, list[tuple[int, int, Entry]]] = {}
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._depth = 0

    def __len__(self) -> int:
        return self._depth

    def queue(self, works: Iterable[tuple[Hashable, int, Any, Hashable | None]],
              now: float = 0.0) -> list[Entry]:
        """Queue (trigger, threshold, op, completion) tuples, all or none; raise QueueFull."""
        works = list(works)
        if self._depth + len(works) > self.bound:
            raise QueueFull(f"deferred work queue full: {self._depth} queued + {len(works)} new "
                            f"> bound {self.bound}")
        entries = []
        for trigger, threshold, op, completion in works:
            if threshold < 0:
                raise ValueError(f"threshold must be >= 0, got {threshold}")
            entry = Entry(next(self._ids), trigger, int(threshold), op, completion, now)
            heapq.heappush(self._heaps.setdefault(trigger, []), (entry.threshold, next(self._seq), entry))
            entries.append(entry)
        self._depth += len(entries)
        return entries

    def triggers(self) -> list[Hashable]:
        """Counters that have pending entries (what a watcher must read)."""
        return list(self._heaps)

    def min_threshold(self, trigger: Hashable) -> int | None:
        heap = self._heaps.get(trigger)
        return heap[0][0] if heap else None

    def pop_due(self, trigger: Hashable, total: int) -> list[Entry]:
        """Remove and return the entries of `trigger` due at success + error = total, in order."""
        heap = self._heaps.get(trigger)
        due = []
        while heap and heap[0][0] <= total:
            due.append(heapq.heappop(heap)[2])
        if heap is not None and not heap:
            del self._heaps[trigger]
        self._depth -= len(due)
        return due

    def cancel(self, trigger: Hashable) -> int:
        """Drop every entry of one counter; return how many."""
        heap = self._heaps.pop(trigger, [])
        self._depth -= len(heap)
        return len(heap)

    def flush(self, where: Callable[[Hashable], bool] | None = None) -> int:
        """Drop every entry (FI_FLUSH_WORK), or those whose trigger satisfies `where`."""
        cancelled = 0
        for trigger in [t for t in self._heaps if where is None or where(t)]:
            cancelled += self.cancel(trigger)
        return cancelled


def progress(dwq: DeferredWorkQueue, read_total: Callable[[Hashable], int],
             fire: Callable[[Entry], None]) -> int:
    """Fire every due entry, repeating while firing makes more due (chained counter ops)."""
    fired = 0
    while True:
        due = [e for t in dwq.triggers() for e in dwq.pop_due(t, read_total(t))]
        if not due:
            return fired
        for entry in due:
            fire(entry)
        fired += len(due)
