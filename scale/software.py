"""Software that is software on both worlds: charged its real CPU time, stretched by D.

The frontend, the agent's control plane and tokenization run on a CPU here and on a CPU on the
profiled platform too. Under dilation D every modeled operation takes D x its modeled time of wall
time; software left as it is would take its real time of wall time, so 1/D of it in virtual time: a
gateway D times faster than it is. A Stretch charges a thread's CPU time instead: after each slice
of work it blocks the thread for (D - 1) x the CPU seconds the slice used. The thread's wall time is
then D x its CPU time, and in virtual time (wall / D) the software runs at its real speed.

On an event loop, `on_loop` ticks in the loop's own thread, every 2 ms of virtual time. Blocking the
loop is the point: the loop is the server of one that the software runs on, and while the profiled
CPU would still be busy, nothing else on that loop runs. The idle loop's own CPU (its wake-ups and
timers) is measured first and not charged (`Stretch.idle_rate`). A handler on a thread pool is `charged` per call
instead (`ChargedServicer` wraps a gRPC servicer's handlers so).

Only CPU time is charged (`time.thread_time`): time the thread waited on I/O, on a lock, or on other
processes sharing these cores is not the software's. Each tick with CPU time is recorded as one
operation of its kind (real = modeled = the CPU seconds: it never violates); the kind's `real_s`
is the software's CPU time, and (D - 1) x that the wall time added.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import Callable, Iterator

from scale.dilation import Pacer

FRONTEND, AGENT = "frontend_software", "agent_software"   # the kinds the services count it under
VIRTUAL_INTERVAL_S = 0.002   # a loop's tick, in virtual seconds: the granularity of the stretch
MIN_INTERVAL_S = 0.005       # and at least this much wall time apart
CALIBRATION_S = 2.0          # the idle loop's own CPU rate is measured this long (wall) before charging
MAX_IDLE_RATE = 0.05         # an idle rate above this (traffic during calibration) is capped to it
MIN_BLOCK_S = 0.0005         # smaller debts are carried to the next tick (a sleep costs ~50 us itself)


def owed_s(cpu_s: float, dilation: float) -> float:
    """Wall seconds a slice of `cpu_s` CPU seconds must add so that it takes dilation x cpu_s."""
    return max(0.0, cpu_s) * (max(1.0, dilation) - 1.0)


class Stretch:
    """Stretches one thread's CPU time by the pacer's D. Call `tick` from that thread only.

    `idle_rate` (CPU seconds per wall second) is the thread's CPU when it serves nothing: its timers,
    its wake-ups, the ticks themselves. It is not charged: on this machine one wake-up of an event loop
    costs 100-230 us of CPU, so at D = 80 a loop ticked every 5 ms would be blocked all the time by its
    own ticks. Its timers are in wall time, so they fire D times as often per virtual second as they
    would on the profiled platform: charging them would charge the dilation, not the software."""

    def __init__(self, pacer: Pacer, kind: str, cpu_clock: Callable[[], float] = time.thread_time,
                 min_block_s: float = MIN_BLOCK_S, idle_rate: float = 0.0,
                 wall_clock: Callable[[], float] = time.perf_counter):
        if not kind:
            raise ValueError("a stretch needs a kind to count its CPU time under")
        self.pacer, self.kind = pacer, kind
        self.cpu_clock, self.wall_clock, self.min_block_s = cpu_clock, wall_clock, min_block_s
        self.idle_rate = idle_rate
        self._last: tuple[float, float] | None = None
        self._owed = 0.0
        self.blocked_s = 0.0   # wall seconds added so far

    def tick(self) -> float:
        """Charge the CPU time used since the last tick beyond the idle rate; returns the wall seconds
        blocked now."""
        cpu, wall = self.cpu_clock(), self.wall_clock()
        if self._last is None:
            self._last = (cpu, wall)
            return 0.0
        used = max(0.0, cpu - self._last[0] - self.idle_rate * max(0.0, wall - self._last[1]))
        self._last = (cpu, wall)
        if used > 0:
            self.pacer.record(self.kind, used, used, violated=False)
            self._owed += owed_s(used, self.pacer.dilation)
        if self._owed < self.min_block_s:
            return 0.0
        block, self._owed = self._owed, 0.0
        self.pacer.sleep(block)
        self.blocked_s += block
        self._last = (self.cpu_clock(), self.wall_clock())  # the sleep is not the software's, nor idle time
        return block


async def on_loop(pacer: Pacer | None, kind: str, virtual_interval_s: float = VIRTUAL_INTERVAL_S,
                  calibration_s: float = CALIBRATION_S) -> asyncio.Task | None:
    """Stretch the running loop's thread by the pacer's D from now on (None, and nothing runs, without
    a pacer or at D = 1). First the idle loop's own CPU rate is measured for `calibration_s`, ticking as
    it will: await this before the service says it listens, so that no traffic is taken for idle. Then
    a task charges, every tick, what the loop used beyond that rate. Ticks are `virtual_interval_s` of
    virtual time apart (D x it of wall time, at least MIN_INTERVAL_S). Cancel the task to stop."""
    if pacer is None or pacer.dilation <= 1.0:
        return None
    if not virtual_interval_s > 0 or calibration_s < 0:
        raise ValueError("the interval must be positive and the calibration not negative")
    interval = max(MIN_INTERVAL_S, virtual_interval_s * pacer.dilation)
    stretch = Stretch(pacer, kind)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    while time.perf_counter() - wall0 < calibration_s:
        await asyncio.sleep(interval)
    span = time.perf_counter() - wall0
    stretch.idle_rate = min(MAX_IDLE_RATE, (time.thread_time() - cpu0) / span) if span > 0 else 0.0
    pacer.mark(f"{kind}_idle_cpu_rate", stretch.idle_rate)   # the snapshot says what is not charged

    async def run() -> None:
        while True:
            stretch.tick()
            await asyncio.sleep(interval)

    return asyncio.get_running_loop().create_task(run(), name=f"kvtb-stretch-{kind}")


@contextlib.contextmanager
def charged(pacer: Pacer | None, kind: str, cpu_clock: Callable[[], float] = time.thread_time) -> Iterator[None]:
    """Around a slice of software on a thread of its own (a handler in a thread pool): on exit, block
    the thread (D - 1) x the CPU time the slice used. Nothing without a pacer or at D = 1."""
    if pacer is None or pacer.dilation <= 1.0:
        yield
        return
    begin = cpu_clock()
    try:
        yield
    finally:
        used = max(0.0, cpu_clock() - begin)
        if used > 0:
            pacer.record(kind, used, used, violated=False)
            pacer.sleep(owed_s(used, pacer.dilation))


class ChargedServicer:
    """A gRPC servicer whose public methods (sync handlers, run in a thread pool) are `charged`: what
    `add_XServicer_to_server` registers in its place under a profile. A handler that streams its
    replies is charged per reply; the methods in `exclude` are not charged."""

    def __init__(self, inner: object, pacer: Pacer, kind: str, cpu_clock: Callable[[], float] = time.thread_time,
                 exclude: frozenset[str] = frozenset()):
        self._inner, self._pacer, self._kind, self._cpu_clock = inner, pacer, kind, cpu_clock
        self._exclude = exclude   # methods passed through as they are

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name.startswith("_") or name in self._exclude or not callable(attr):
            return attr
        pacer, kind, cpu_clock = self._pacer, self._kind, self._cpu_clock
        if inspect.isgeneratorfunction(attr):
            @functools.wraps(attr)
            def streamed(*args, **kwargs):
                replies = attr(*args, **kwargs)
                while True:
                    with charged(pacer, kind, cpu_clock):
                        try:
                            reply = next(replies)
                        except StopIteration:
                            return
                    yield reply
            return streamed

        @functools.wraps(attr)
        def call(*args, **kwargs):
            with charged(pacer, kind, cpu_clock):
                return attr(*args, **kwargs)
        return call
