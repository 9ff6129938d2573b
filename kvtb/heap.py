"""Keep value-sized buffers in glibc's heap, so their pages are reused rather than faulted in anew.

Every Store arrives in a new ZeroMQ message and every GET's reply too; a PUT gathers into a new
buffer. With glibc's default thresholds each is a fresh mmap whose pages fault in one by one
(and on a virtual machine, memory the guest never touched costs the host a fault too); kept in
the heap, a freed buffer's pages serve the next one. One arena for every thread, too: a
thread's own arena grows in 64 MiB heaps that glibc gives back when they empty, so buffers of
many MiB allocated on one thread (ZeroMQ's, the watcher's) kept landing on fresh pages.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def keep_large_buffers_in_the_heap(mmap_threshold_bytes: int = 512 << 20,
                                   trim_threshold_bytes: int = 1 << 30) -> bool:
    """Raise glibc's mmap and trim thresholds and use one arena for this process (call it before
    starting threads); False where mallopt refuses."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)
                  and libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes)
                  and libc.mallopt(_M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        ok = False
    if not ok:
        logger.warning("mallopt refused; large buffers stay mmapped")
    return ok
