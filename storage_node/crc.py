"""crc32c (Castagnoli) over any buffer, without copies and without holding the GIL.

google_crc32c's C extension accepts only `bytes` and keeps the GIL for writable buffers, so
the hardware routine of its bundled libcrc32c is called through ctypes (ctypes releases the
GIL during the call). Falls back to google_crc32c on a copy when the library is missing.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os
from collections.abc import Iterable

import google_crc32c
import numpy as np

logger = logging.getLogger(__name__)


def _load_extend():
    libs_dir = os.path.dirname(google_crc32c.__file__) + ".libs"
    for path in glob.glob(os.path.join(libs_dir, "libcrc32c*.so*")):
        try:
            func = ctypes.CDLL(path).crc32c_extend
        except (OSError, AttributeError):
            continue
        func.restype = ctypes.c_uint32
        func.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        return func
    logger.warning("libcrc32c not found beside google_crc32c; crc32c will copy buffers")
    return None


_EXTEND = _load_extend()


def crc32c_extend(crc: int, buf) -> int:
    """Extend crc with the bytes of buf (bytes, bytearray, memoryview, numpy array, zmq buffer)."""
    view = memoryview(buf)
    if view.nbytes == 0:
        return crc
    if _EXTEND is None:
        return google_crc32c.extend(crc, view.tobytes())
    arr = np.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view, np.uint8)
    return _EXTEND(crc, arr.ctypes.data, arr.nbytes)


def crc32c(buffers: Iterable | bytes | bytearray | memoryview) -> int:
    """crc32c of one buffer or of the concatenation of several."""
    if isinstance(buffers, (bytes, bytearray, memoryview, np.ndarray)):
        return crc32c_extend(0, buffers)
    crc = 0
    for buf in buffers:
        crc = crc32c_extend(crc, buf)
    return crc
