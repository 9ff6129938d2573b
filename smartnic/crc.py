"""crc32c over any buffer (memoryview of the region, zmq.Frame) without copying it.

google_crc32c's Python binding only takes bytes objects, so a view of shared memory would
have to be copied first; this calls the same C library (shipped in the wheel) through
ctypes, which also releases the GIL while it runs.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os

import google_crc32c
import numpy as np

logger = logging.getLogger(__name__)


def _load():
    libs = os.path.join(os.path.dirname(google_crc32c.__file__), os.pardir, "google_crc32c.libs")
    for path in glob.glob(os.path.join(libs, "libcrc32c*.so*")):
        try:
            lib = ctypes.CDLL(path)
            lib.crc32c_extend.restype = ctypes.c_uint32
            lib.crc32c_extend.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
            return lib.crc32c_extend
        except (OSError, AttributeError):
            continue
    logger.warning("libcrc32c not found beside google_crc32c: crc32c will copy buffers")
    return None


_extend = _load()


def extend(crc: int, buf) -> int:
    """crc32c of the bytes so far (crc) followed by buf."""
    if isinstance(buf, bytes):
        return google_crc32c.extend(crc, buf)
    array = np.frombuffer(buf, dtype=np.uint8)
    if array.size == 0:
        return crc
    if _extend is None:
        return google_crc32c.extend(crc, array.tobytes())
    return _extend(crc, array.ctypes.data, array.size)


def value(buf) -> int:
    return extend(0, buf)
