"""Give freed heap memory back to the system once the fabric is idle after refusing unauthenticated work.

The node keeps large buffers in glibc's heap and trims it only past 1 GiB free
(`kvtb.heap.keep_large_buffers_in_the_heap`), so that a value's pages serve the next one. What a
peer that never authenticated made the node (or libzmq) hold would then stay resident: a flood
of Connects, a large message refused. `IdleTrim` calls malloc_trim(0) once such work was refused
(`want`) and the fabric has received nothing for `idle_s`; the hosts' own traffic never triggers
it, so their buffers keep their pages.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

IDLE_S = 2.0


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class IdleTrim:
    """seen(now) on every message received, want() when unauthenticated work was refused; tick(now) each
    loop turn trims once idle after a want(). Not thread-safe."""

    def __init__(self, idle_s: float = IDLE_S, trim=None):
        self.idle_s = idle_s
        self._trim = trim if trim is not None else _malloc_trim()
        self._last = 0.0
        self._dirty = False
        self.trims = 0

    def seen(self, now: float) -> None:
        self._last = now

    def want(self) -> None:
        self._dirty = True

    def tick(self, now: float) -> bool:
        """Trim when wanted since the last trim and nothing arrived for idle_s; True if it did."""
        if not self._dirty or now - self._last < self.idle_s or self._trim is None:
            return False
        self._dirty = False
        self._trim(0)
        self.trims += 1
        return True
