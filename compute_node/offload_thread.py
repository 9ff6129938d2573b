"""The triggered offload's stores, off the engine's thread: the NIC's part of step 2 that this testbed
still does on the host (writing each block's descriptor, storing its trigger, ringing the doorbell).

On the paper's hardware the GPU's part of a PUT is one store to a counter, and the NIC does the
rest. Here the engine thread names each block that filled (its hash chain, which the prefix cache
computes anyway), pins it and hands the step's batch over; this thread, on the CPUs it is given
(under placement `nic`: the NIC's), makes the offloader's `store_many` call and hands back the PUTs
to wait for, which the engine takes in at its next poll (`OffloadTracker.poll`). The tracker stays the
engine thread's alone: this thread touches the offloader and its own two queues, nothing else.

Bounded: at most `max_batches` batches wait (one per step with a filled block; the engine's pool
bounds their blocks); past it there is no `room` and the engine stores on its own thread.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading
import time
from typing import Any

from kvtb.placement import parse_cpus

logger = logging.getLogger(__name__)

MAX_BATCHES = 1024
MAX_NAP_US = 100_000
NAP_FOR_S = 10.0  # a napping thread naps this long after its last batch, then waits to be woken (as the agent's watcher)


@dataclasses.dataclass
class HandStats:
    """What the thread did: batches and blocks stored, the wait from hand-off to trigger (wall) and its own
    CPU time storing them (seconds, summed), and the batches whose store raised."""

    batches: int = 0
    blocks: int = 0
    handoff_s: float = 0.0
    cpu_s: float = 0.0
    failed: int = 0

    def as_dict(self) -> dict[str, Any]:
        per = max(1, self.blocks)
        return {"batches": self.batches, "blocks": self.blocks, "failed": self.failed,
                "handoff_us_per_block": round(self.handoff_s / per * 1e6, 1),
                "cpu_us_per_block": round(self.cpu_s / per * 1e6, 1)}


@dataclasses.dataclass(eq=False)
class Handed:
    """A batch handed over: the offloader, its blocks (compute_node.offload.Block), and when."""

    offloader: Any
    blocks: list
    at: float = dataclasses.field(default_factory=time.perf_counter)


@dataclasses.dataclass(eq=False)
class Stored:
    """A batch's answer: its blocks and their PUTs (compute_node.offload.PendingPut), or the error the
    store raised (then no PUT is known, and the engine counts every block of it as not stored)."""

    blocks: list
    puts: list | None
    error: BaseException | None = None


class OffloadThread:
    """One daemon thread storing the batches the engine hands over. `hand` and `take` are the engine's;
    `close` stops the thread (what was handed and not stored yet is stored first)."""

    def __init__(self, cpus: str = "", max_batches: int = MAX_BATCHES, name: str = "offload", nap_us: int = 0):
        self.cpus = parse_cpus(cpus)  # ValueError on a bad list
        if max_batches < 1:
            raise ValueError(f"max_batches must be 1 or more, got {max_batches}")
        if not 0 <= nap_us <= MAX_NAP_US:
            raise ValueError(f"nap_us must be 0 .. {MAX_NAP_US}, got {nap_us}")
        self.max_batches, self.nap_s = max_batches, nap_us / 1e6
        self.stats = HandStats()
        # nap_us 0: the thread sleeps on the queue and a hand-off wakes it (a futex wake, on the engine's
        # thread); else it looks every nap_us and a hand-off is an append (for a thread on CPUs of its own)
        self._in: queue.SimpleQueue[Handed | None] | collections.deque[Handed | None] = \
            collections.deque() if nap_us else queue.SimpleQueue()
        # a napping thread idle for NAP_FOR_S stops napping and waits on _bell, which the next hand-off rings
        self._bell, self._asleep = threading.Event(), False
        self._out: collections.deque[Stored] = collections.deque()
        self._waiting = 0  # handed and not yet taken back (the engine's count: bounds both queues)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def room(self) -> bool:
        """Whether another batch may be handed over (fewer than max_batches wait)."""
        return self._waiting < self.max_batches

    def hand(self, offloader, blocks: list) -> None:
        """Hand a batch over (RuntimeError, nothing handed, when there is no `room`)."""
        if self._waiting >= self.max_batches:
            raise RuntimeError(f"offload thread: {self._waiting} batches wait already (at most {self.max_batches})")
        self._waiting += 1
        self._push(Handed(offloader, blocks))

    def take(self) -> list[Stored]:
        """The batches stored since the last take (engine thread)."""
        out = []
        while self._out:
            out.append(self._out.popleft())
        self._waiting -= len(out)
        return out

    @property
    def pending(self) -> int:
        """Batches handed over and not yet taken back."""
        return self._waiting

    def close(self, timeout_s: float = 5.0) -> None:
        self._push(None)
        self._thread.join(timeout_s)

    def _push(self, handed: Handed | None) -> None:
        if not self.nap_s:
            self._in.put(handed)
            return
        self._in.append(handed)
        if self._asleep:  # idle for NAP_FOR_S: one wake-up
            self._bell.set()

    def _run(self) -> None:
        if self.cpus:
            try:
                os.sched_setaffinity(0, self.cpus)  # this thread only
            except OSError as exc:
                logger.warning("offload thread: CPUs %s not allowed here (%s); it runs where the node runs",
                               self.cpus, exc.strerror)
        last = time.monotonic()
        while True:
            if self.nap_s:
                if not self._in:
                    if time.monotonic() - last < NAP_FOR_S:
                        time.sleep(self.nap_s)
                        continue
                    self._bell.clear()
                    self._asleep = True
                    if not self._in:  # (a hand-off after this sees _asleep and rings)
                        self._bell.wait()
                    self._asleep = False
                    continue
                handed = self._in.popleft()
                last = time.monotonic()
            else:
                handed = self._in.get()
            if handed is None:
                return
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                stored = Stored(handed.blocks, handed.offloader.store_many(handed.blocks, [None] * len(handed.blocks)))
            except Exception as exc:  # a bug: the engine counts the batch as not stored
                logger.exception("offload thread: storing %d blocks failed", len(handed.blocks))
                stored = Stored(handed.blocks, None, exc)
                self.stats.failed += 1
            s = self.stats
            s.batches += 1
            s.blocks += len(handed.blocks)
            s.handoff_s += (started - handed.at) * len(handed.blocks)
            s.cpu_s += time.thread_time() - cpu
            self._out.append(stored)
