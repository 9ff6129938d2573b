"""The watcher's doorbell: the compute node's side (the agent's is smartnic/_poller.c).

The agent's watcher polls a pool's trigger counters while stores are arriving; between bursts it
sleeps, and says so in the doorbell, the first 4 bytes of the layout's `bell_counter` (a futex word
in the shared region): SLEEPING (1) or AWAKE (0). After a counter store the compute node reads the
word; only when it says SLEEPING does it set it AWAKE and wake the watcher (FUTEX_WAKE, one system
call per burst of stores; none while the watcher polls). This is io_uring's SQPOLL protocol (the
kernel's polling thread sets IORING_SQ_NEED_WAKEUP before it sleeps): a NIC polls its doorbells in
hardware, a thread on a virtual machine's shared cores cannot afford to.

The word is read right after the store without a fence, so a store can race the watcher going to
sleep and go unrung; the watcher then sees it when its sleep times out (its wait is bounded), late
but never lost. Where futex is not there (not Linux, or an unknown architecture) ring() resets the
word and wakes no one: the watcher polls at its timeout.
"""
from __future__ import annotations

import ctypes
import platform
import sys

import numpy as np

from hostmem.kv_layout import COUNTER_BYTES, KvLayout

AWAKE, SLEEPING = 0, 1
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())


def _futex_wake():
    """libc's syscall(SYS_futex, addr, FUTEX_WAKE, 1, ...) as a callable of the address, or None."""
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:  # PyDLL: the call keeps the GIL (a wake does not block; released, the engine could wait ms to get it back)
        syscall = ctypes.PyDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lambda address: syscall(_SYS_FUTEX, address, _FUTEX_WAKE, 1)


_WAKE = _futex_wake()


class Bell:
    """The doorbell of one pool, rung by its compute node (one thread: the engine's)."""

    def __init__(self, layout: KvLayout, counters: np.ndarray):
        """counters: the region's [counter, success|error] uint64 array (writable)."""
        at = layout.bell_counter * COUNTER_BYTES
        self.word = memoryview(counters).cast("B")[at:at + 4].cast("I")  # [1] u32: the futex word, in place
        self.address = ctypes.addressof(ctypes.c_uint32.from_buffer(self.word))
        self.rings = 0

    def ring(self) -> bool:
        """After a counter store: wake the watcher if it sleeps; whether it did."""
        word = self.word
        if word[0] != SLEEPING:
            return False
        word[0] = AWAKE
        if _WAKE is not None:
            _WAKE(self.address)
        self.rings += 1
        return True
