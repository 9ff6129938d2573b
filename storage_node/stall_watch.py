"""Stalls of the storage node, logged with what they waited on.

Two watches, each threshold `STALL_S` (1 s):

- `LoopWatch`: a thread of its own notices the fabric thread busy (not waiting in its poll) for
  longer than the threshold, and logs what it was doing and where it is (its stack), once per stall
  and again with the stall's length once it ends. The fabric thread cannot report its own stall.
- `CommandWatch` (the fabric thread checks every CHECK_S): commands outstanding longer than the
  threshold are logged once, one line per host, queue and stage, with the oldest's command id and
  what it waits on now (parked behind its own full queue, an I/O worker, the group commit's
  fdatasync, a Flush's fdatasync, the modeled drive of a hardware profile), and once more when
  they were answered.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

STALL_S = 1.0   # a loop turn or a command longer than this is a stall
CHECK_S = 0.25  # how often the watches look
REPEAT_S = 10.0  # a host, queue and stage's stall line at most this often (the commands between are counted)
MAX_KEYS = 1024  # (host, queue, stage) kept for that, at most


def describe_command(cmd) -> str:
    """"kv_store (command id 7, key 6b31) of host nqn... on queue 2"."""
    key = cmd.capsule.key.hex() if cmd.capsule.key else "-"
    return (f"{cmd.spec.name} (command id {cmd.capsule.command_id}, key {key}) of host "
            f"{cmd.controller.host_nqn} on queue {cmd.controller.qid}")


def waits_on(cmd, parked: bool, executor_state: Callable[[], str]) -> str:
    """What an outstanding command waits on now, in words."""
    if parked:
        q = cmd.controller.queue
        return (f"parked: its queue is full ({q.depth} of its host's commands executing, {q.waiting} parked), "
                f"it starts when one of them completes")
    stage = cmd.stage
    if cmd.waits_on is not None:
        try:
            return f"{stage}: {cmd.waits_on()}"
        except Exception as exc:  # noqa: BLE001 - a description must never fail the check
            return f"{stage} ({type(exc).__name__} describing it)"
    if stage.startswith("waiting for an I/O worker"):
        return f"{stage}: {executor_state()}"
    return stage


def executor_state(executor) -> Callable[[], str]:
    """A function describing a ThreadPoolExecutor's backlog (best effort: its queue is private)."""
    def describe() -> str:
        work = getattr(executor, "_work_queue", None)
        threads = getattr(executor, "_threads", ())
        return (f"{work.qsize() if work is not None else '?'} jobs queued for {len(threads)} I/O workers"
                if executor is not None else "no executor")
    return describe


class CommandWatch:
    """Commands outstanding past the threshold, logged with what they wait on: one line per host, queue and
    stage for those that newly passed it (how many, the oldest, what it waits on), then one line per host
    and queue once they were answered; each such line at most every repeat_s (those between are counted
    in the next), so a node that stays overloaded logs a few lines every 10 s, not one per command. The
    fabric thread calls check() every CHECK_S and answered() for every command it answers; not
    thread-safe."""

    def __init__(self, stats=None, describe_executor: Callable[[], str] = lambda: "", threshold: float = STALL_S,
                 repeat_s: float = REPEAT_S):
        self.stats, self.describe_executor, self.threshold = stats, describe_executor, threshold
        self.repeat_s = repeat_s
        self._over: dict[tuple[str, int], list] = {}  # (host, qid) -> [stalled commands answered, longest s]
        self._logged: dict[tuple, float] = {}        # (host, qid, parked, stage) -> when last logged
        self._held: dict[tuple, int] = {}            # (host, qid, parked, stage) -> commands not logged since
        self._over_logged: dict[tuple[str, int], float] = {}  # (host, qid) -> when its "stall over" was logged

    def check(self, controllers: Iterable, now: float) -> int:
        """Log the commands that passed the threshold since the last check; how many."""
        groups: dict[tuple, list] = {}
        for controller in controllers:
            for _, cmd, parked in controller.queue.items():
                if cmd is None or cmd.stall_logged or now - cmd.admitted <= self.threshold:
                    continue
                cmd.stall_logged = True
                groups.setdefault((controller.host_nqn, controller.qid, parked, cmd.stage), []).append(cmd)
        for key, cmds in groups.items():
            if now - self._logged.get(key, float("-inf")) < self.repeat_s:  # said lately: counted, said later
                self._held[key] = self._held.get(key, 0) + len(cmds)
                continue
            self._logged[key] = now
            host, qid, parked, _ = key
            oldest = min(cmds, key=lambda c: c.admitted)
            held = self._held.pop(key, 0)
            logger.warning("stall: %d command%s of host %s on queue %d outstanding over %.0f s (the oldest %s, "
                           "for %.1f s), waiting on %s%s", len(cmds), "s" if len(cmds) > 1 else "", host, qid,
                           self.threshold, describe_command(oldest), now - oldest.admitted,
                           waits_on(oldest, parked, self.describe_executor),
                           f"; {held} more waited so in the last {self.repeat_s:.0f} s" if held else "")
        for (host, qid), over in list(self._over.items()):
            if now - over[2] < self.repeat_s:
                continue
            count, longest = over[0], over[1]
            logger.warning("stall over: %d stalled command%s of host %s on queue %d answered, the last after %.1f s",
                           count, "s" if count > 1 else "", host, qid, longest)
            del self._over[(host, qid)]
            self._over_logged[(host, qid)] = now
        if len(self._logged) > MAX_KEYS:  # hosts and stages come and go: forget the old ones
            self._logged = {k: t for k, t in self._logged.items() if now - t < self.repeat_s}
            self._held = {k: n for k, n in self._held.items() if k in self._logged}
        logged = sum(len(c) for c in groups.values())
        if logged and self.stats is not None:
            self.stats.stalled(logged)
        return logged

    def answered(self, cmd, now: float) -> None:
        """A command was answered: count how long it took; a stalled one is reported at the next check."""
        took = now - cmd.admitted
        if self.stats is not None:
            self.stats.command_took(took, lambda: f"{describe_command(cmd)}, last {cmd.stage}")
        if cmd.stall_logged:
            key = (cmd.controller.host_nqn, cmd.controller.qid)
            over = self._over.get(key)
            if over is None:
                if len(self._over_logged) > MAX_KEYS:
                    self._over_logged = {k: t for k, t in self._over_logged.items() if now - t < self.repeat_s}
                over = self._over[key] = [0, 0.0, self._over_logged.get(key, float("-inf"))]
            over[0] += 1
            over[1] = max(over[1], took)


class LoopWatch:
    """Notices a thread (the fabric loop) busy past the threshold and logs what it does there.

    The watched thread calls busy(what) when it leaves its wait and idle() before it waits again;
    both are plain assignments. Thread-safe for that one writer and the watch thread.
    """

    def __init__(self, name: str = "fabric", threshold: float = STALL_S, period: float = CHECK_S, stats=None):
        self.name, self.threshold, self.period, self.stats = name, threshold, period, stats
        self.since = 0.0       # when the current busy spell began (0: idle)
        self.doing = ""
        self.detail: Callable[[], str] | None = None  # more about what it does, asked only on a stall
        self.stalls = 0
        self._ident: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, ident: int | None = None) -> LoopWatch:
        """Watch the thread `ident` (default: the caller's)."""
        self._ident = ident if ident is not None else threading.get_ident()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def busy(self, doing: str, detail: Callable[[], str] | None = None) -> None:
        if not self.since:
            self.since = time.monotonic()
        self.doing, self.detail = doing, detail

    def idle(self) -> None:
        self.since = 0.0

    def _run(self) -> None:
        reported = 0.0  # the `since` of the spell already reported
        while not self._stop.wait(self.period):
            since = self.since
            if reported and since != reported:
                logger.warning("stall over: the %s thread was busy for %.1f s", self.name, time.monotonic() - reported)
                reported = 0.0
            if since and since != reported and time.monotonic() - since > self.threshold:
                reported = since
                self.stalls += 1
                if self.stats is not None:
                    self.stats.stalled()
                logger.warning("stall: the %s thread has been busy for %.1f s %s%s (it reads the socket for "
                               "every host: none is answered meanwhile); it is at:\n%s", self.name,
                               time.monotonic() - since, self.doing, self._detail(), self._stack())

    def _detail(self) -> str:
        try:
            return f" ({self.detail()})" if self.detail is not None else ""
        except Exception as exc:  # noqa: BLE001
            return f" ({type(exc).__name__} describing it)"

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._ident)
        return "".join(traceback.format_stack(frame, limit=8)) if frame is not None else "(thread gone)"
