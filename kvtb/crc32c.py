"""crc32c (Castagnoli) over any buffer, without copying it and, for large ones, without the GIL.

google_crc32c's own binding takes only `bytes`, so a view of shared memory or a received ZeroMQ
frame would have to be copied first. Its wheel ships the C library (hardware SSE4.2 routine),
which is called here through ctypes. A buffer of RELEASE_GIL_BYTES or more is checksummed with
the GIL released, so other threads run meanwhile; a smaller one keeps the GIL, because handing
the GIL to a waiting thread and taking it back costs more than the checksum itself. A small
read-only view (a chunk header cut from received bytes) goes to google_crc32c as a copy. Falls
back to google_crc32c on a copy when the library is missing.
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

RELEASE_GIL_BYTES = 1 << 20
SMALL_BYTES = 4096  # a read-only buffer up to this size is copied to bytes: cheaper than numpy's address


def _load(loader) -> ctypes._CFuncPtr | None:
    """crc32c_extend of the library in google_crc32c's wheel, loaded by ctypes.CDLL or ctypes.PyDLL."""
    here = os.path.dirname(google_crc32c.__file__)
    for libs in (here + ".libs", os.path.join(here, os.pardir, "google_crc32c.libs")):
        for path in glob.glob(os.path.join(libs, "libcrc32c*.so*")):
            try:
                func = loader(path).crc32c_extend
            except (OSError, AttributeError):
                continue
            func.restype = ctypes.c_uint32
            func.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
            return func
    return None


_EXTEND = _load(ctypes.CDLL)             # releases the GIL during the call
_EXTEND_HOLDING_GIL = _load(ctypes.PyDLL)  # keeps it
if _EXTEND is None or _EXTEND_HOLDING_GIL is None:
    logger.warning("libcrc32c not found beside google_crc32c: crc32c will copy buffers")


def _address(buf) -> tuple[int, int]:
    """(address, size in bytes) of a contiguous buffer."""
    try:  # writable buffers (numpy arrays, views of shared memory): cheapest
        size = buf.nbytes if hasattr(buf, "nbytes") else memoryview(buf).nbytes
        return ctypes.addressof(ctypes.c_char.from_buffer(buf)), size
    except (TypeError, ValueError):  # read-only (a received ZeroMQ frame) or empty
        array = np.frombuffer(buf, dtype=np.uint8)
        return (array.ctypes.data if array.size else 0), array.size


def extend(crc: int, buf) -> int:
    """crc32c of the bytes so far (crc) followed by buf (bytes, numpy array, memoryview, zmq buffer)."""
    if isinstance(buf, bytes):
        return google_crc32c.extend(crc, buf)
    if _EXTEND is None or _EXTEND_HOLDING_GIL is None or \
            (isinstance(buf, memoryview) and buf.readonly and buf.nbytes <= SMALL_BYTES):
        return google_crc32c.extend(crc, memoryview(buf).tobytes())
    address, size = _address(buf)
    if not size:
        return crc
    return (_EXTEND if size >= RELEASE_GIL_BYTES else _EXTEND_HOLDING_GIL)(crc, address, size)


def crc32c(buffers: Iterable | bytes | bytearray | memoryview | np.ndarray) -> int:
    """crc32c of one buffer or of the concatenation of several."""
    if isinstance(buffers, (bytes, bytearray, memoryview, np.ndarray)):
        return extend(0, buffers)
    crc = 0
    for buf in buffers:
        crc = extend(crc, buf)
    return crc
