"""The triggered-operation engine: the deferred work queue, its counter watcher, firing.

The watcher reads the PUT triggers of every registered pool (its standing PUTs, one vectorised
read per pool) and the counters that have one-off entries queued. When something fired it
polls again at once; with nothing due it spins for `spin_s`, then sleeps with exponential
backoff up to `max_sleep_s`; with nothing queued at all it sleeps until woken. Trigger-to-
fire latency is measured from when the watcher first saw the counter's new value (or from
queuing, for an entry due at once) to the firing.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from hostmem import gather
from smartnic.datapath import ChunkRef
from hostmem.region import RegionError
from smartnic.registrations import Registrations, Registered, UnknownRegion
from smartnic.stats import Stats
from smartnic.triggered import CounterKey, DeferredWorkQueue, Entry

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CounterWork:
    """Add to or set a counter's success part (chaining); no completion counter."""

    kind: str  # "add" or "set"
    counter: int
    value: int


@dataclasses.dataclass(frozen=True)
class DataWork:
    """A one-off PUT or GET of one chunk of a plain region: its token ids, then its ranges."""

    kind: str  # "put" or "get"
    ref: ChunkRef
    ranges: tuple[tuple[int, int], ...]
    token_ids: tuple[int, int]

    @functools.cached_property
    def runs(self) -> tuple[gather.Run, ...]:
        """The copy plan of token_ids then ranges (computed once; ValueError for a negative length)."""
        return tuple(gather.runs_of((self.token_ids, *self.ranges)))


@dataclasses.dataclass(frozen=True)
class OpError:
    op_id: int
    completion_counter: int
    kind: str
    message: str
    ref: ChunkRef | None


Done = Callable[[str | None, str], None]  # (error kind or None, message)


class TriggerEngine:
    """Thread-safe: queue/cancel/flush from any thread; one watcher thread fires."""

    def __init__(self, regions: Registrations, stats: Stats, handle_data: Callable[[Registered, Entry, Done], None],
                 bound: int = 512, spin_s: float = 200e-6, max_sleep_s: float = 1e-3,
                 fire_block: Callable[[Registered, int, int], None] | None = None):
        self.regions, self.stats, self.handle_data = regions, stats, handle_data
        self.fire_block = fire_block  # a standing PUT fired: (registration, block, generation)
        self.on_block_fire: list[Callable[[Registered, int, int, int], None]] = []  # (reg, block, gen, ns)
        self.spin_s, self.max_sleep_s = spin_s, max_sleep_s
        self._dwq = DeferredWorkQueue(bound)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._seen: dict[CounterKey, tuple[int, int]] = {}  # trigger -> (total, first seen ns)
        self.on_fire: list[Callable[[Entry, int], None]] = []  # hooks (benchmarks): (entry, fire ns)
        self._thread = threading.Thread(target=self._run, name="counter-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @property
    def depth(self) -> int:
        with self._lock:
            return len(self._dwq)

    def queue(self, reg: Registered, works: Sequence[tuple[int, int, object, int | None]]) -> list[int]:
        """Queue (trigger, threshold, work, completion) tuples, all or none; QueueFull past the bound."""
        for trigger, _, work, completion in works:
            reg.region.read_counter(trigger)  # RegionError when out of range
            if completion is not None:
                reg.region.read_counter(completion)
            if isinstance(work, CounterWork):
                reg.region.read_counter(work.counter)
            else:  # an access outside the region is refused now (and checked again when it fires)
                try:
                    lo, hi = gather.span(work.runs)
                except ValueError as exc:
                    raise RegionError(str(exc)) from exc
                reg.region.check(lo, hi - lo)
        now = time.monotonic_ns()
        with self._lock:
            entries = self._dwq.queue(
                [(CounterKey(reg.region_id, t), th, w, None if c is None else CounterKey(reg.region_id, c))
                 for t, th, w, c in works], now=now)
        self._wake.set()
        return [e.op_id for e in entries]

    def cancel(self, region_id: int, counter: int) -> int:
        """Cancel the counter's entries that are not due; fire those already due first.

        On the NIC an entry fires the moment its counter reaches the threshold, so an entry that
        is due when the cancel arrives has fired already; here the watcher may not have seen the
        store yet, and cancelling would lose it.
        """
        trigger = CounterKey(region_id, counter)
        due: list[Entry] = []
        with self._lock:
            try:
                reg = self.regions.get(region_id)
                due = self._dwq.pop_due(trigger, reg.region.counter_total(counter))
            except (UnknownRegion, TypeError, ValueError):
                reg = None
            cancelled = self._dwq.cancel(trigger)
            self._seen.pop(trigger, None)
        now_ns = time.monotonic_ns()
        for entry in due:
            self._fire(reg, entry, now_ns)
        return cancelled

    def flush(self, region_id: int | None = None) -> int:
        with self._lock:
            return self._dwq.flush(None if region_id is None else (lambda t: t.region_id == region_id))

    # -- the watcher
    def _run(self) -> None:
        sleep, idle_since = 10e-6, None
        while not self._stop.is_set():
            if self._poll():
                sleep, idle_since = 10e-6, None
                continue
            if self.depth == 0 and not self._standing():
                self._wake.wait(0.5)  # nothing armed; registration wakes it
                self._wake.clear()
                continue
            now = time.perf_counter()
            idle_since = idle_since or now
            if now - idle_since < self.spin_s:
                continue
            if self._wake.wait(sleep):
                self._wake.clear()
                sleep = 10e-6
            else:
                sleep = min(sleep * 2, self.max_sleep_s)

    def _standing(self) -> list[Registered]:
        return [reg for reg in self.regions.all() if reg.standing is not None and not reg.closed]

    def _poll_standing(self) -> int:
        """Fire every standing PUT whose block's trigger moved (one vectorised read per pool)."""
        fired = 0
        for reg in self._standing():
            try:
                due = reg.standing.due()
            except (TypeError, ValueError, IndexError):  # the region went away under us
                continue
            for block, generation in due:
                seen_ns = time.monotonic_ns()
                self.stats.inc("triggered_fired")
                for hook in self.on_block_fire:
                    hook(reg, block, generation, seen_ns)
                try:
                    self.fire_block(reg, block, generation)
                except Exception:  # a bug must end on the counter, not kill the watcher
                    logger.exception("firing the standing PUT of block %d failed", block)
                    reg.add(reg.layout.put_done(block), error=1)
                self.stats.latency((time.monotonic_ns() - seen_ns) / 1000)
            fired += len(due)
        return fired

    def _poll(self) -> int:
        due: list[tuple[Registered, Entry, int]] = []
        fired = self._poll_standing() if self.fire_block is not None else 0
        with self._lock:
            now = time.monotonic_ns()
            for trigger in self._dwq.triggers():
                try:
                    reg = self.regions.get(trigger.region_id)
                    total = reg.region.counter_total(trigger.counter)
                except (UnknownRegion, TypeError, ValueError):
                    self._dwq.cancel(trigger)  # the region went away
                    continue
                seen = self._seen.get(trigger)
                if seen is None or seen[0] != total:
                    seen = self._seen[trigger] = (total, now)
                due.extend((reg, e, seen[1]) for e in self._dwq.pop_due(trigger, total))
                if self._dwq.min_threshold(trigger) is None:
                    self._seen.pop(trigger, None)
        for reg, entry, observed_ns in due:
            self._fire(reg, entry, observed_ns)
        return len(due) + fired

    def _fire(self, reg: Registered, entry: Entry, observed_ns: int) -> None:
        fire_ns = time.monotonic_ns()
        self.stats.inc("triggered_fired")
        self.stats.latency((fire_ns - max(observed_ns, int(entry.queued_at))) / 1000)
        for hook in self.on_fire:
            hook(entry, fire_ns)
        work = entry.op
        if isinstance(work, CounterWork):
            if work.kind == "add":
                reg.add(work.counter, work.value)
            else:
                reg.set(work.counter, work.value)
            return
        try:
            self.handle_data(reg, entry, lambda kind, message: self.complete(reg, entry, kind, message))
        except Exception as exc:  # a bug must end on the counter, not kill the watcher
            logger.exception("firing op %d failed", entry.op_id)
            self.complete(reg, entry, "internal", str(exc))

    def complete(self, reg: Registered, entry: Entry, kind: str | None, message: str = "") -> None:
        """Bump the completion counter: success part, or error part with the error queued."""
        if kind is not None:
            self.stats.inc_kind("errors", kind)
            ref = entry.op.ref if isinstance(entry.op, DataWork) else None
            counter = entry.completion.counter if entry.completion else 0
            reg.errors.append(OpError(entry.op_id, counter, kind, message, ref))
            logger.warning("op %d failed (%s): %s", entry.op_id, kind, message)
        if entry.completion is None or reg.closed:
            return
        if kind is None:
            reg.add(entry.completion.counter, success=1)
        else:
            reg.add(entry.completion.counter, error=1)
