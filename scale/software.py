"""Software that is software on both worlds: charged its real CPU time, stretched by D.

The frontend, the agent's control plane and tokenization run on a CPU here and on a CPU on the
profiled platform too. Under dilation D every modeled operation takes D x its modeled time of wall
time; software left as it is would take its real time of wall time, so 1/D of it in virtual time: a
gateway D times faster than it is. A Stretch charges a thread's CPU time instead: after each slice
of work it blocks the thread for (D - 1) x the CPU seconds the slice used. The thread's wall time is
then D x its CPU time, and in virtual time (wall / D) the software runs at its real speed.

On an event loop, `on_loop` ticks every `interval_s` in the loop's own thread. Blocking the loop is
the point: the loop is the server of one that the software runs on, and while the profiled CPU would
still be busy, nothing else on that loop runs. A handler on a thread pool is `charged` per call
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
DEFAULT_INTERVAL_S = 0.005   # a loop's tick: the granularity of the stretch
MIN_BLOCK_S = 0.0005         # smaller debts are carried to the next tick (a sleep costs ~50 us itself)


def owed_s(cpu_s: float, dilation: float) -> float:
    """Wall seconds a slice of `cpu_s` CPU seconds must add so that it takes dilation x cpu_s."""
    return max(0.0, cpu_s) * (max(1.0, dilation) - 1.0)


class Stretch:
    """Stretches one thread's CPU time by the pacer's D. Call `tick` from that thread only."""

    def __init__(self, pacer: Pacer, kind: str, cpu_clock: Callable[[], float] = time.thread_time,
                 min_block_s: float = MIN_BLOCK_S):
        if not kind:
            raise ValueError("a stretch needs a kind to count its CPU time under")
        self.pacer, self.kind = pacer, kind
        self.cpu_clock, self.min_block_s = cpu_clock, min_block_s
        self._last: float | None = None
        self._owed = 0.0
        self.blocked_s = 0.0   # wall seconds added so far

    def tick(self) -> float:
        """Charge the CPU time used since the last tick; returns the wall seconds blocked now."""
        now = self.cpu_clock()
        if self._last is None:
            self._last = now
            return 0.0
        used = max(0.0, now - self._last)
        self._last = now
        if used > 0:
            self.pacer.record(self.kind, used, used, violated=False)
            self._owed += owed_s(used, self.pacer.dilation)
        if self._owed < self.min_block_s:
            return 0.0
        block, self._owed = self._owed, 0.0
        self.pacer.sleep(block)
        self.blocked_s += block
        self._last = self.cpu_clock()  # the sleep's own CPU time is not the software's
        return block


def on_loop(pacer: Pacer | None, kind: str, interval_s: float = DEFAULT_INTERVAL_S) -> asyncio.Task | None:
    """Stretch the running loop's thread by the pacer's D (None, and nothing runs, without a pacer or at
    D = 1). Call from a coroutine on that loop; cancel the task to stop."""
    if pacer is None or pacer.dilation <= 1.0:
        return None
    if not interval_s > 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    stretch = Stretch(pacer, kind)

    async def run() -> None:
        while True:
            stretch.tick()
            await asyncio.sleep(interval_s)

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
