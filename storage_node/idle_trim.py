"""Give freed heap memory back to the system once the fabric has been idle a while.

The node keeps large buffers in glibc's heap and trims it only past 1 GiB free
(`kvtb.heap.keep_large_buffers_in_the_heap`), so that a value's pages serve the next one. After a
burst (a flood of messages before authentication, or a large message the node refused) that
memory would stay resident; `IdleTrim` calls malloc_trim(0) once the fabric has received nothing
for `idle_s`, at most once per burst, where it costs no throughput.
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
    """seen(now) on every message received; tick(now) each loop turn trims once idle. Not thread-safe."""

    def __init__(self, idle_s: float = IDLE_S, trim=None):
        self.idle_s = idle_s
        self._trim = trim if trim is not None else _malloc_trim()
        self._last = 0.0
        self._dirty = False
        self.trims = 0

    def seen(self, now: float) -> None:
        self._last, self._dirty = now, True

    def tick(self, now: float) -> bool:
        """Trim when something arrived since the last trim and nothing has for idle_s; True if it did."""
        if not self._dirty or now - self._last < self.idle_s or self._trim is None:
            return False
        self._dirty = False
        self._trim(0)
        self.trims += 1
        return True
