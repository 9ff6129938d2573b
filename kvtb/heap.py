"""Keep value-sized buffers in glibc's heap, so their pages are reused rather than faulted in anew.

Every Store arrives in a new ZeroMQ message and every GET's reply too; a PUT gathers into a new
buffer. With glibc's default thresholds each is a fresh mmap whose pages fault in one by one
(and on a virtual machine, memory the guest never touched costs the host a fault too); kept in
the heap, a freed buffer's pages serve the next one.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_large_buffers_in_the_heap(mmap_threshold_bytes: int = 512 << 20,
                                   trim_threshold_bytes: int = 1 << 30) -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where mallopt refuses."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)
                  and libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes))
    except (OSError, AttributeError):
        ok = False
    if not ok:
        logger.warning("mallopt refused; large buffers stay mmapped")
    return ok
