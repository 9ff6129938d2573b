"""What the agent's control plane and its fast path process say to each other (pure).

Every message is a tuple whose first item names it, pickled by multiprocessing.connection over
the socket pair the agent made (both ends are the NIC: one trust domain, no port).

control plane → fast path:
    (SETTINGS, SmartNicSettings)                            the first message
    (REGISTER, request id, region id, shm name, size, counter offset, counter count, layout bytes)
    (DEREGISTER, request id, region id)
    (RESTORE, restore id, region id, [(StoredBlock, runs, pool block)], groups)   steps 6 and 7: GETs land
                            in the region here, each block's layer group bumps its GET-done counter here
    (STOP,)
fast path → control plane:
    (READY, pid, compiled: bool, the watcher thread's id)  after SETTINGS, once connected
    (REPLY, request id, error message or None)
    (STATS, [op, ...])      forwarded statistics, in order: ("inc", name, n), ("kind", group, kind, n),
                            ("latency", µs), ("fired", region id, block, generation, store ns, fire ns)
    (STORED, context id, StoredBlock or None, error kind or None, error message)
                            a PUT ended; sent before its PUT-done counter moves
    (ENDED, restore id, index, error kind or None, error message)
                            every layer group of a restore's block was reported (its counters moved)
"""
from __future__ import annotations

import threading
from collections.abc import Callable

SETTINGS, REGISTER, DEREGISTER, RESTORE, STOP = "settings", "register", "deregister", "restore", "stop"
READY, REPLY, STATS, STORED, ENDED = "ready", "reply", "stats", "stored", "ended"
MAX_PENDING_OPS = 65536  # forwarded statistics held between flushes (the oldest go past it, counted)


class ForwardingStats:
    """smartnic.stats.Stats' recording side, buffered for the control plane. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ops: list[tuple] = []
        self.dropped = 0

    def _add(self, op: tuple) -> None:
        with self._lock:
            if len(self._ops) >= MAX_PENDING_OPS:
                self.dropped += 1
                return
            self._ops.append(op)

    def inc(self, name: str, n: int = 1) -> None:
        self._add(("inc", name, n))

    def inc_kind(self, group: str, kind: str, n: int = 1) -> None:
        self._add(("kind", group, kind, n))

    def latency(self, microseconds: float) -> None:
        self._add(("latency", microseconds))

    def fired(self, region_id: int, block: int, generation: int, store_ns: int, fire_ns: int) -> None:
        self._add(("fired", region_id, block, generation, store_ns, fire_ns))

    def take(self) -> list[tuple]:
        with self._lock:
            ops, self._ops = self._ops, []
        return ops


def apply(ops: list[tuple], stats, on_fired: Callable[[int, int, int, int, int], None]) -> None:
    """Replay forwarded statistics into the control plane's Stats; fires go to on_fired."""
    for op in ops:
        kind = op[0]
        if kind == "inc":
            stats.inc(op[1], op[2])
        elif kind == "kind":
            stats.inc_kind(op[1], op[2], op[3])
        elif kind == "latency":
            stats.latency(op[1])
        elif kind == "fired":
            on_fired(*op[1:])
