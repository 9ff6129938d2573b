"""Dilated time: every modeled operation takes max(its real time, D x its modeled time) of wall time.

A Pacer times the real work of an operation, then waits out the rest of its budget D x modeled. Wall
time over D is virtual time: what the profiled hardware would take. An operation whose real time
exceeded its budget is a dilation violation (virtual time is then too long for it); violations are
counted per kind of operation, beside the operations, their real and their modeled seconds.

A resource is a named server of one, kept as a timeline: an operation on it starts when the
previous one's budget ends (an NVMe drive is a stage of the paper's pipeline: its commands run one
after another). An operation that must not block its thread reserves its slot (`reserve`) and later
`settle`s it: the caller completes it at the ticket's end (`defer` runs a callback then).

The clock and the sleep are passed in (tests drive a fake clock). The process's pacer, if any, is
`current()`: a service sets it once at start from its settings (`install`), as it sets its clock.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

MAX_DILATION = 1e6


class DilationError(ValueError):
    """A dilation factor that is not a positive number."""


@dataclass
class OpStats:
    ops: int = 0
    violations: int = 0
    real_s: float = 0.0
    modeled_s: float = 0.0
    overrun_s: float = 0.0     # real time past the budgets, summed over the violations
    worst_ratio: float = 0.0   # max real / modeled: the D this kind needs

    def snapshot(self) -> dict:
        return {"ops": self.ops, "violations": self.violations,
                "violation_fraction": self.violations / self.ops if self.ops else 0.0,
                "real_s": self.real_s, "modeled_s": self.modeled_s, "overrun_s": self.overrun_s,
                "worst_ratio": self.worst_ratio}


class Pacer:
    """Paces modeled operations by dilation D. Thread-safe."""

    def __init__(self, dilation: float, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, resources: tuple[str, ...] | None = None,
                 profile: str = ""):
        check_dilation(dilation)
        self.dilation, self.profile = float(dilation), profile
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._stats: dict[str, OpStats] = {}
        self._timelines = {name: Timeline() for name in (resources or {})}
        self._marks: dict[str, float] = {}
        self._deferred: list = []
        self._deferred_cv = threading.Condition()
        self._seq = itertools.count()
        self._timer: threading.Thread | None = None

    def budget_s(self, modeled_s: float) -> float:
        return self.dilation * max(0.0, modeled_s)

    @contextlib.contextmanager
    def op(self, kind: str, modeled_s: float, resource: str | None = None) -> Iterator[None]:
        """Around the real work of one operation: on exit, wait out its budget (D x modeled_s from the
        start of the work, or from when the resource is free, if later) or count a violation. The
        wait runs even when the work raised (the hardware took its time); the error then propagates."""
        ticket = self.reserve(kind, modeled_s, resource)
        try:
            yield
        finally:
            left = self.settle(ticket)
            if left > 0:
                self.sleep(left)

    def reserve(self, kind: str, modeled_s: float, resource: str | None = None,
                not_before: float = 0.0) -> "Ticket":
        """The operation's real work starts now: its slot on `resource` (from `not_before` at the
        earliest: when its data is delivered) and the wall time it ends."""
        now = self.clock()
        budget = self.budget_s(modeled_s)
        timeline = self._timelines.get(resource) if resource else None
        ready = max(now, not_before)
        start = timeline.take(ready, budget) if timeline is not None else ready
        return Ticket(kind, modeled_s, now, start + budget, resource if timeline is not None else None)

    def settle(self, ticket: "Ticket", stalled: float = 0.0) -> float:
        """The ticket's real work ended now: record it; the seconds left until its end (0: violated).
        `stalled`: seconds the work waited on other paced operations meanwhile (not its own: its end
        moves that much later)."""
        now = self.clock()
        end = ticket.end + max(0.0, stalled)
        violated = now > end
        self.record(ticket.kind, ticket.modeled_s, now - ticket.started - max(0.0, stalled), violated)
        return 0.0 if violated else end - now

    def defer(self, at: float, fn: Callable[[], None]) -> None:
        """Call fn() at wall time `at` (this pacer's clock) on the pacer's timer thread; now if past."""
        if at <= self.clock():
            fn()
            return
        with self._deferred_cv:
            heapq.heappush(self._deferred, (at, next(self._seq), fn))
            if self._timer is None:
                self._timer = threading.Thread(target=self._run_timer, name="kvtb-pacer", daemon=True)
                self._timer.start()
            self._deferred_cv.notify()

    def _run_timer(self) -> None:
        while True:
            with self._deferred_cv:
                while not self._deferred or self._deferred[0][0] > self.clock():
                    timeout = self._deferred[0][0] - self.clock() if self._deferred else None
                    self._deferred_cv.wait(timeout)
                _, _, fn = heapq.heappop(self._deferred)
            try:
                fn()
            except Exception:  # noqa: BLE001 - a completion's failure is its own; the timer goes on
                import logging
                logging.getLogger(__name__).exception("a deferred completion failed")

    def record(self, kind: str, modeled_s: float, real_s: float, violated: bool | None = None) -> bool:
        """Count one operation of `kind`; True when it violated its budget (by default: real > D x modeled)."""
        budget = self.budget_s(modeled_s)
        violated = real_s > budget if violated is None else violated
        with self._lock:
            s = self._stats.setdefault(kind, OpStats())
            s.ops += 1
            s.real_s += real_s
            s.modeled_s += modeled_s
            if violated:
                s.violations += 1
                s.overrun_s += max(0.0, real_s - budget)
            if modeled_s > 0:  # an operation without a modeled time (a delivery check) needs no D
                s.worst_ratio = max(s.worst_ratio, real_s / modeled_s)
        return violated

    def mark(self, name: str, at: float | None = None) -> None:
        """Note the wall time (this pacer's clock) of the latest event `name` (a store accepted, ...)."""
        with self._lock:
            self._marks[name] = self.clock() if at is None else at

    def virtual(self, wall_s: float) -> float:
        return wall_s / self.dilation

    def snapshot(self) -> dict:
        """{"profile", "dilation", "kinds": {kind: stats}, "ops", "violations", "violation_fraction"}."""
        with self._lock:
            kinds = {k: s.snapshot() for k, s in sorted(self._stats.items())}
            marks = dict(self._marks)
        ops = sum(k["ops"] for k in kinds.values())
        violations = sum(k["violations"] for k in kinds.values())
        return {"profile": self.profile, "dilation": self.dilation, "kinds": kinds, "ops": ops,
                "violations": violations, "violation_fraction": violations / ops if ops else 0.0,
                "marks": marks}

    def reset(self) -> None:
        with self._lock:
            self._stats.clear()
            self._marks.clear()


@dataclass(frozen=True)
class Ticket:
    kind: str
    modeled_s: float
    started: float   # when the real work began
    end: float       # when the operation ends in wall time: its slot's start + D x modeled
    resource: str | None = None


class Timeline:
    """A server of one in wall time: each operation's slot starts when the previous slot ends."""

    def __init__(self):
        self._free = float("-inf")
        self._lock = threading.Lock()

    def take(self, now: float, budget: float) -> float:
        """Reserve `budget` seconds from max(now, the end of the last slot); returns the slot's start."""
        with self._lock:
            start = max(now, self._free)
            self._free = start + budget
            return start


def check_dilation(value: float) -> float:
    try:
        d = float(value)
    except (TypeError, ValueError):
        raise DilationError(f"dilation must be a number, got {value!r}") from None
    if not (1.0 <= d <= MAX_DILATION):
        raise DilationError(f"dilation must be between 1 and {MAX_DILATION:g}, got {value!r}")
    return d


def dilation_needed(kinds: Mapping[str, Mapping], margin: float = 2.0) -> tuple[float, dict[str, float]]:
    """From a warm-up's per-kind stats (a snapshot's "kinds", run at D = 1): the D each kind needs
    (its worst real / modeled) and the run's D: the largest, times margin, at least 1."""
    need = {k: float(s["worst_ratio"]) for k, s in kinds.items() if s.get("ops")}
    if not need:  # nothing measured: nothing to dilate for
        return 1.0, need
    return max(1.0, max(need.values()) * margin), need


def merge(snapshots: list[Mapping]) -> dict:
    """Several processes' snapshots (of one run) as one: stats added per kind."""
    kinds: dict[str, dict] = {}
    for snap in snapshots:
        for k, s in (snap or {}).get("kinds", {}).items():
            m = kinds.setdefault(k, {"ops": 0, "violations": 0, "real_s": 0.0, "modeled_s": 0.0,
                                     "overrun_s": 0.0, "worst_ratio": 0.0})
            for f in ("ops", "violations", "real_s", "modeled_s", "overrun_s"):
                m[f] += s.get(f, 0)
            m["worst_ratio"] = max(m["worst_ratio"], s.get("worst_ratio", 0.0))
    for m in kinds.values():
        m["violation_fraction"] = m["violations"] / m["ops"] if m["ops"] else 0.0
    ops = sum(m["ops"] for m in kinds.values())
    violations = sum(m["violations"] for m in kinds.values())
    first = next((s for s in snapshots if s), {})
    return {"profile": first.get("profile", ""), "dilation": first.get("dilation"), "kinds": kinds, "ops": ops,
            "violations": violations, "violation_fraction": violations / ops if ops else 0.0}


def since(after: Mapping, before: Mapping | None) -> dict:
    """The operations of `after` (a snapshot) that came after `before` (an earlier one of the same
    pacer): counts and seconds subtracted per kind; worst_ratio stays after's (it cannot be taken back)."""
    if not before:
        return dict(after)
    kinds = {}
    for k, s in after.get("kinds", {}).items():
        b = before.get("kinds", {}).get(k, {})
        d = {f: s.get(f, 0) - b.get(f, 0) for f in ("ops", "violations", "real_s", "modeled_s", "overrun_s")}
        if d["ops"] <= 0:
            continue
        d["worst_ratio"] = s.get("worst_ratio", 0.0)
        d["violation_fraction"] = d["violations"] / d["ops"]
        kinds[k] = d
    ops = sum(d["ops"] for d in kinds.values())
    violations = sum(d["violations"] for d in kinds.values())
    return {**after, "kinds": kinds, "ops": ops, "violations": violations,
            "violation_fraction": violations / ops if ops else 0.0}


def invalid_kinds(snapshot: Mapping, depends_on: list[str] | None = None, limit: float = 0.01) -> list[str]:
    """The kinds (of those a claim depends on; every kind when None) with more than `limit` of their
    operations in violation: a claim judged on them is invalid."""
    kinds = snapshot.get("kinds", {})
    names = kinds if depends_on is None else [k for k in depends_on if k in kinds]
    return [k for k in names if kinds[k]["violation_fraction"] > limit]


# -- the process's pacer ------------------------------------------------------------------------------

_current: Pacer | None = None


def install(pacer: Pacer | None) -> None:
    global _current
    _current = pacer


def current() -> Pacer | None:
    return _current


def pacing_json() -> str:
    """The process's pacer's snapshot as JSON ("" in real time): what a service's Stats reports."""
    import json
    return json.dumps(_current.snapshot()) if _current is not None else ""
