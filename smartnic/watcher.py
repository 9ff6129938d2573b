"""The triggered-operation engine: the deferred work queue, the standing PUTs, their counter watcher.

The watcher polls the counters: every registered pool's standing PUT triggers (one strided read
per pool) and the counters that one-off entries wait on. It never waits on anything the compute
node would have to signal (no syscall on the compute side): its wait is adaptive polling, by how
recently something fired —

- hot, for `spin_s` after a fire: polls back to back, yielding the GIL between polls (more
  stores of the same engine step are on their way);
- warm, for `warm_s` after a fire: sleeps `poll_s` between polls (the next block of a running
  decode fills soon);
- cold: the sleep doubles up to `max_sleep_s` (the first store after a quiet spell waits at most
  that long; a registration or queue call restarts the doubling, it does not warm the watcher),
  and with nothing armed at all it sleeps until a registration or queue call wakes it.

Its thread asks the kernel for a timer slack of TIMER_SLACK_NS (Linux's default, 50 µs, would
add that much to every short sleep) and, with `realtime` (setting `watcher_realtime`), to be a
SCHED_FIFO thread where that is permitted: on a machine whose cores the compute node keeps busy,
an ordinary thread's wake-up waits for a core (p99 in milliseconds), a real-time one's does not. Trigger-to-fire latency is measured from the counter store:
a standing PUT's from the stamp its descriptor carries (the compute node's clock just before its
store; CLOCK_MONOTONIC, one clock for every process of the host), a one-off entry's from when
the watcher first saw the counter's new value (or from queuing, for an entry due at once), to the
moment the operation is issued (a PUT handed to the data path).

With `compiled` (setting `watcher_compiled`) and the compiled poller built (smartnic/_poller.c), a
registered pool's triggers are polled by C code without the GIL, and the warm polling goes: while
the watcher has nothing else to poll (one pool, no one-off entries) it waits in C, polling back to
back for `spin_s` after a fire and then sleeping on the pool's doorbell (hostmem.bell) until the
compute node rings it after a store, or `bell_timeout_s` passes. On a virtual machine a timer
wake-up costs far more CPU than a poll, so polling every 30 µs took a large share of a core from
the compute node's forward (`kvtb bench smartnic`: `watcher_cpu_python_vs_compiled`); the doorbell
costs the compute node one system call per burst of stores instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Sequence

from hostmem import gather
from kvtb.doorbell import Doorbell
from smartnic.datapath import ChunkRef
from hostmem.region import RegionError
from smartnic.registrations import Registrations, Registered, UnknownRegion
from smartnic.standing import VERDICTS, StandingPuts
from smartnic.stats import Stats
from smartnic.triggered import CounterKey, DeferredWorkQueue, Entry

logger = logging.getLogger(__name__)

TIMER_SLACK_NS = 1000
BUSY_SLICE_S = 0.001  # a busy poller's wait in C returns this often when nothing fired (to see other work)
RING_TAKE_TIMEOUT_S = 0.05  # a ring's consumer looks up this often when nothing fired (to see a stop or a close)
STAMP_LIMIT_NS = 60_000_000_000  # a descriptor stamp further back than this is not this store's
_PR_SET_TIMERSLACK = 29


def realtime(priority: int = 1) -> bool:
    """Make the calling thread SCHED_FIFO at `priority` (Linux, with CAP_SYS_NICE); False otherwise.

    The watcher stands in for the NIC's own engine: when the compute node's threads keep every
    core busy, an ordinary thread waking from a sleep waits for a core for milliseconds, a real-
    time one does not. It sleeps between polls, and Linux caps real-time threads at 95% of a core."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))  # 0: the calling thread
    except (AttributeError, OSError):
        return False
    return True


def fine_timer_slack(ns: int = TIMER_SLACK_NS) -> bool:
    """Ask Linux to wake the calling thread's sleeps within `ns` of their end; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


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


@dataclasses.dataclass(frozen=True)
class WatcherSettings:
    """How the counter watcher polls: SmartNicSettings' watcher_* keys in seconds (WatcherSettings.of)."""

    bound: int = 512                # the deferred work queue's entries
    spin_s: float = 200e-6          # after a fire: poll back to back this long (its burst goes on)
    max_sleep_s: float = 400e-6     # the longest sleep between polls, backing off from poll_s
    poll_s: float = 30e-6           # the first sleep between polls
    warm_s: float = 2.0             # after a fire: sleep at most poll_s this long
    realtime: bool = False          # ask for SCHED_FIFO (never for a busy poller)
    compiled: bool = True           # poll pools with the compiled poller, where built
    bell_timeout_s: float = 0.005   # the longest wait on a pool's doorbell
    busy: bool = False              # poll back to back, never sleeping (a NIC core of its own)
    cpus: tuple[int, ...] = ()      # the watcher thread's own CPUs; (): its process's
    ring: bool = False              # checked fires pass to the PUT path through the compiled poller's ring
    nap_s: float = 0.0              # compiled, alone: for nap_warm_s after a fire, nap this long at a time
    nap_warm_s: float = 10.0        # with the doorbell left awake, instead of sleeping on it (0: off)

    @classmethod
    def of(cls, settings, cpus: tuple[int, ...] = ()) -> WatcherSettings:
        """From a SmartNicSettings (cpus: the watcher thread's own CPUs, from the placement)."""
        return cls(settings.queue_bound, settings.watcher_spin_us * 1e-6, settings.watcher_max_sleep_us * 1e-6,
                   settings.watcher_poll_us * 1e-6, settings.watcher_warm_ms * 1e-3, settings.watcher_realtime,
                   settings.watcher_compiled, settings.watcher_bell_timeout_ms * 1e-3, settings.watcher_busy_poll,
                   tuple(cpus), settings.watcher_fire_ring, settings.watcher_nap_us * 1e-6,
                   settings.watcher_nap_warm_ms * 1e-3)


class TriggerEngine:
    """Thread-safe: queue/cancel/flush from any thread; one watcher thread fires."""

    def __init__(self, regions: Registrations, stats: Stats, handle_data: Callable[[Registered, Entry, Done], None],
                 watch: WatcherSettings | None = None,
                 fire_block: Callable[[Registered, int, int], int | None] | None = None, check_descriptors: bool = False):
        watch = watch if watch is not None else WatcherSettings()
        self.regions, self.stats, self.handle_data = regions, stats, handle_data
        # a standing PUT fired: (registration, block, generation) -> its descriptor's stamp (0: none) once
        # the PUT is issued, None when it was refused
        self.fire_block = fire_block
        self.on_block_fire: list[Callable[[Registered, int, int, int, int], None]] = []  # (reg, block, gen, store ns, fire ns)
        self.spin_s, self.poll_s, self.warm_s = watch.spin_s, watch.poll_s, watch.warm_s
        self.max_sleep_s = max(watch.max_sleep_s, watch.poll_s)
        # the compiled poller checks a fired block's descriptor in C (fire_block then takes its verdict)
        self.check_descriptors = check_descriptors
        self.cpus, self.busy = watch.cpus, watch.busy
        # asked for: the watcher thread as SCHED_FIFO (`is_realtime`: granted); never for a busy poller,
        # which would then keep every other thread of its core off it
        self.realtime = watch.realtime and not watch.busy
        self.is_realtime = False
        self.compiled = watch.compiled  # asked for: pools polled by the compiled poller, where built
        # asked for: a checking poller's own thread polls and pushes its fires into a ring, which a thread of
        # this engine per pool drains, issuing the PUTs itself (no hand-off between Python threads)
        self.ring = watch.ring and check_descriptors
        self._drains: dict[int, threading.Thread] = {}  # region id -> the thread draining its pool's ring
        self._process_cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self.bell_timeout_s = watch.bell_timeout_s
        self.nap_s, self.nap_warm_s = (0.0, 0.0) if watch.busy else (watch.nap_s, watch.nap_warm_s)
        self._dwq = DeferredWorkQueue(watch.bound)
        self._lock = threading.Lock()
        self._wakeup = Doorbell()  # ends the watcher's sleeps: wake(), stop()
        self._woken = False  # wake() since the watcher last looked: back off afresh
        self._waiting: StandingPuts | None = None  # the pool the watcher waits on in C, if any
        self._stop = threading.Event()
        self._seen: dict[CounterKey, tuple[int, int]] = {}  # trigger -> (total, first seen ns)
        self._pools: tuple[int, tuple[Registered, ...]] = (-1, ())  # (registrations' version, pools)
        self.on_fire: list[Callable[[Entry, int], None]] = []  # hooks (benchmarks): (entry, fire ns)
        self._thread = threading.Thread(target=self._run, name="counter-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._woken = True
        self._ring()

    def stop(self) -> None:
        self._stop.set()
        self._ring()
        for reg in self._pools[1]:
            if reg.standing is not None:
                reg.standing.interrupt_take()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for drain in list(self._drains.values()):
            drain.join(timeout=5)
        if not self._thread.is_alive():
            self._wakeup.close()

    def _ring(self) -> None:
        """End the watcher's sleep, or its wait on a pool's doorbell."""
        waiting = self._waiting
        if waiting is not None:
            waiting.interrupt()
        self._wakeup.ring()

    def _sleep(self, timeout_s: float) -> None:
        """Sleep until the timeout, wake() or stop(), whichever comes first."""
        fd = self._wakeup.fd
        if fd >= 0 and (timeout_s <= 0 or select.select([fd], [], [], timeout_s)[0]):
            self._wakeup.answer()

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
        self.wake()
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
        fine_timer_slack()
        if self.cpus:  # this thread alone: the PUT and I/O threads keep to the process's other CPUs
            os.sched_setaffinity(0, self.cpus)
            logger.info("counter watcher: on CPUs %s of its own", ",".join(map(str, self.cpus)))
        if self.realtime:
            self.is_realtime = realtime()
            logger.info("counter watcher: %s", "real-time (SCHED_FIFO 1)" if self.is_realtime
                        else "an ordinary thread (real-time scheduling not permitted here)")
        sleep, last_fire, spin = self.poll_s, float("-inf"), 0.0  # cold until something fires
        while not self._stop.is_set():
            if self._poll():
                sleep, last_fire, spin = self.poll_s, time.perf_counter(), self.spin_s
                continue
            pools = tuple(reg for reg in self._standing() if not reg.standing.ring_running)  # a ring polls its own
            alone = len(pools) == 1 and pools[0].standing.poller is not None and not len(self._dwq)
            self._waiting = pools[0].standing if alone else None  # before _woken is read: wake() interrupts it
            if self._woken:  # something was queued or registered: back off afresh, not warm
                self._woken = False
                sleep = self.poll_s
                continue
            if alone:
                fired = self._wait(pools[0], BUSY_SLICE_S if self.busy else spin)
                if fired:
                    last_fire = time.perf_counter()
                spin = self.spin_s if fired else 0.0  # spin only right after a fire: its burst goes on
                continue
            if not len(self._dwq) and not pools:
                self._sleep(0.5)  # nothing armed; registration or queuing wakes it
                continue
            quiet = time.perf_counter() - last_fire
            if quiet < self.spin_s or self.busy:
                time.sleep(0)  # hot: let other threads have the GIL, poll again
            elif quiet < self.warm_s:
                self._sleep(self.poll_s)
            else:
                self._sleep(sleep)
                sleep = min(sleep * 2, self.max_sleep_s)

    def _wait(self, reg: Registered, spin_s: float) -> int:
        """Wait in C on the pool's doorbell (spinning spin_s first) and fire what it found; how many."""
        try:
            due = reg.standing.wait(spin_s, 0.0 if self.busy else self.bell_timeout_s, self.nap_s, self.nap_warm_s)
        except (ValueError, RuntimeError, AttributeError):  # closed under us: deregistered
            due = []
        finally:
            self._waiting = None
        return self._fire_standing(reg, due)

    def _standing(self) -> tuple[Registered, ...]:
        """The registered pools (kept until a registration or deregistration); a new pool's arming goes
        to the compiled poller where asked for and built."""
        if self.fire_block is None:  # standing PUTs are fired elsewhere (the fast path's process)
            return ()
        version = self.regions.version
        if self._pools[0] != version:
            pools = tuple(reg for reg in self.regions.all() if reg.standing is not None)
            for reg in pools:
                if self.compiled and not reg.closed and reg.standing.poller is None and \
                        reg.standing.start_compiled(check=self.check_descriptors):
                    logger.info("region %d: its %d standing PUTs are polled by the compiled poller, with a doorbell",
                                reg.region_id, len(reg.standing))
                if self.ring and not reg.closed and reg.region_id not in self._drains:
                    self._start_ring(reg)
            self._pools = (version, pools)
        return self._pools[1]

    def _start_ring(self, reg: Registered) -> None:
        """(on the watcher thread: the poller's thread takes its CPUs and policy) The pool's poller polls on a
        native thread of its own from now on, and a thread of this engine drains its ring."""
        spin = BUSY_SLICE_S if self.busy else self.spin_s
        if not reg.standing.start_ring(spin, self.bell_timeout_s, self.busy):
            return
        drain = threading.Thread(target=self._drain, args=(reg,), name=f"fire-ring-{reg.region_id}", daemon=True)
        self._drains[reg.region_id] = drain
        drain.start()
        logger.info("region %d: its fires pass to the PUT path through the compiled poller's ring", reg.region_id)

    def _drain(self, reg: Registered) -> None:
        """The ring's consumer: take the fires (no GIL while it waits) and issue their PUTs on this thread,
        until the pool closes or the engine stops. An ordinary thread on the process's other CPUs (started
        by the watcher, it would take the watcher's own CPUs and real-time policy, which are the ring's
        native thread's: the NIC's engine)."""
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if self.cpus:
            with contextlib.suppress(AttributeError, OSError):
                os.sched_setaffinity(0, (self._process_cpus - set(self.cpus)) or self._process_cpus)
        try:
            while not self._stop.is_set() and not reg.closed:
                try:
                    due = reg.standing.take(RING_TAKE_TIMEOUT_S)
                except (ValueError, RuntimeError, AttributeError):  # closed under us: deregistered
                    break
                if due:
                    self._fire_standing(reg, due, inline=True)
        finally:
            self._drains.pop(reg.region_id, None)

    def _poll_standing(self) -> int:
        """Fire every standing PUT whose block's trigger moved (one strided read per pool)."""
        fired = 0
        for reg in self._standing():
            if reg.closed or reg.standing.ring_running:  # a ring's own thread polls it
                continue
            try:
                due = reg.standing.fired()
            except (TypeError, ValueError, IndexError):  # the region went away under us
                continue
            fired += self._fire_standing(reg, due)
        return fired

    def _fire_standing(self, reg: Registered, due: list[tuple], inline: bool = False) -> int:
        """Issue the PUT of each (block, generation, seen ns[, verdict, checked ns]) that fired; how many.
        With the compiled poller's verdict, fire_block is told it (its descriptor was checked in C).
        inline: this thread is a PUT thread (the ring's consumer): every fire is handed on first, then
        their PUTs run here, in order."""
        puts: list[tuple] = []
        issue = (lambda *put: puts.append(put)) if inline else None
        for fired in due:
            block, generation, seen_ns = fired[:3]
            seen_ns = seen_ns or time.monotonic_ns()
            self.stats.inc("triggered_fired")
            try:
                if issue is not None:
                    stamp_ns = self.fire_block(reg, block, generation, verdict_text(fired[3]), issue)
                elif len(fired) > 3:
                    stamp_ns = self.fire_block(reg, block, generation, verdict_text(fired[3]))
                else:
                    stamp_ns = self.fire_block(reg, block, generation)
            except Exception:  # a bug must end on the counter, not kill the watcher
                logger.exception("firing the standing PUT of block %d failed", block)
                reg.add(reg.layout.put_done(block), error=1)
                continue
            if stamp_ns is None:  # refused: no PUT
                continue
            fire_ns = time.monotonic_ns()
            store_ns = stamp_ns if 0 < stamp_ns <= seen_ns and fire_ns - stamp_ns < STAMP_LIMIT_NS else seen_ns
            self.stats.latency((fire_ns - store_ns) / 1000)
            # where the time went: store -> seen by a poll (the wake-up), seen -> issued (the check and hand-off)
            self.stats.inc("fire_seen_ns_total", max(0, seen_ns - store_ns))
            self.stats.inc("fire_issue_ns_total", max(0, fire_ns - seen_ns))
            for hook in self.on_block_fire:
                hook(reg, block, generation, store_ns, fire_ns)
        for put, *args in puts:
            put(*args)
        return len(due)

    def _poll(self) -> int:
        fired = self._poll_standing() if self.fire_block is not None else 0
        if not len(self._dwq):  # read without the lock: queue() wakes the watcher after adding
            return fired
        due: list[tuple[Registered, Entry, int]] = []
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


def engine_of(settings, regions: Registrations, stats, handle_data, fire_block=None,
              watcher_cpus: tuple[int, ...] = ()) -> TriggerEngine:
    """The trigger engine a SmartNicSettings asks for (watcher_cpus: its watcher thread's own CPUs)."""
    return TriggerEngine(regions, stats, handle_data, WatcherSettings.of(settings, watcher_cpus), fire_block=fire_block,
                         check_descriptors=fire_block is not None)


def verdict_text(code: int) -> str:
    """The compiled poller's verdict as fire_block takes it: "" passed, else why it refused."""
    if not code:
        return ""
    return VERDICTS[code] if 0 < code < len(VERDICTS) else f"refused by the compiled check (code {code})"
