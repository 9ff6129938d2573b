"""Namespaces backed by files: the common part, buffer <-> extent I/O, and the NVM block namespace."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from fabric import status as st
from fabric.status import NvmeError
from kvtb.crc32c import extend as crc32c_extend
from storage_node.allocator import Extent

logger = logging.getLogger(__name__)

LBA_BYTES = 4096
IOV_MAX = 1024
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def byte_view(buf) -> memoryview:
    """A flat unsigned-byte view of any contiguous buffer (no copy)."""
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def pwritev_all(fd: int, views: list[memoryview], offset: int) -> None:
    """Write views back to back at offset, retrying short writes."""
    pending = deque(v for v in views if v.nbytes)
    while pending:
        batch = [pending[i] for i in range(min(IOV_MAX, len(pending)))]
        written = os.pwritev(fd, batch, offset)
        offset += written
        while written:
            head = pending[0]
            if written >= head.nbytes:
                written -= head.nbytes
                pending.popleft()
            else:
                pending[0] = head[written:]
                written = 0


CHECK_BLOCK_BYTES = 512 << 10  # written, then checksummed while still in the CPU's cache
WRITEBACK_BYTES = 4 << 20      # written, then handed to the disk while the rest is copied


def write_extents(fd: int, buffers: Sequence, extents: Iterable[Extent],
                  crc: int | None = None, writeback: bool = False) -> int | None:
    """Scatter the concatenation of buffers over extents (in order) with pwritev, without copies.

    With crc (the crc32c so far, usually 0) it is extended over the bytes as they are written,
    a block at a time right after its pwritev, and returned: the bytes cross memory once.
    With writeback, the kernel is asked to start writing the bytes back (`start_writeback`)
    every WRITEBACK_BYTES as they are written, and at the end of each extent: the disk works
    on the first MiBs of a large value while the rest is still being copied, so the fdatasync
    that follows waits for the last few only. A value under WRITEBACK_BYTES is handed over
    once, when it is all written.
    """
    views = deque(v for v in (byte_view(b) for b in buffers) if v.nbytes)
    block = CHECK_BLOCK_BYTES if crc is not None else 1 << 62
    for ext in extents:
        offset, room = ext.offset, ext.length
        unsynced = offset  # written bytes from here on are not yet handed to writeback
        while room and views:
            iov, size = [], 0
            while views and size < min(room, block):
                head = views[0]
                take = min(room - size, block - size, head.nbytes)
                iov.append(head[:take])
                if take == head.nbytes:
                    views.popleft()
                else:
                    views[0] = head[take:]
                size += take
            pwritev_all(fd, iov, offset)
            if crc is not None:
                for view in iov:
                    crc = crc32c_extend(crc, view)
            offset, room = offset + size, room - size
            if writeback and offset - unsynced >= WRITEBACK_BYTES:
                start_writeback(fd, (Extent(unsynced, offset - unsynced),))
                unsynced = offset
        if writeback and offset > unsynced:
            start_writeback(fd, (Extent(unsynced, offset - unsynced),))
        if not views:
            break
    return crc


_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, extents: Iterable[Extent]) -> None:
    """Ask the kernel to start writing extents back now, so a later fdatasync waits less.

    Only a hint (sync_file_range with SYNC_FILE_RANGE_WRITE): durability still comes from the
    fdatasync of the commit. Does nothing where the call is missing.
    """
    for ext in extents:
        if _libc.sync_file_range(fd, ctypes.c_int64(ext.offset), ctypes.c_int64(ext.length),
                                 _SYNC_FILE_RANGE_WRITE) != 0:
            return


def read_extents(fd: int, extents: Iterable[Extent], out: memoryview, past_end: str = "zeros") -> None:
    """Fill out (a writable byte view) from extents in order.

    Past the file's end it reads zeros (past_end="zeros", a block device's unwritten LBAs) or
    raises EOFError (past_end="raise", a value whose bytes are gone).
    """
    pos = 0
    for ext in extents:
        end = min(pos + ext.length, out.nbytes)
        offset = ext.offset
        while pos < end:
            n = os.preadv(fd, [out[pos:end]], offset)
            if n == 0:
                if past_end == "raise":
                    raise EOFError(f"the file ends before offset {offset}")
                out[pos:end] = bytes(end - pos)
                n = end - pos
            pos += n
            offset += n
        if pos >= out.nbytes:
            return


def new_buffer(nbytes: int) -> np.ndarray:
    """An uninitialised byte buffer for a read: [nbytes] uint8 (not zero-filled, not reused)."""
    return np.empty(nbytes, dtype=np.uint8)


class Syncer:
    """A namespace's Flushes: fdatasync on a thread of its own, started at the first one, so that neither
    the fabric thread nor an I/O worker ever waits for the disk's cache. Flushes queued while one
    runs share the next fdatasync (each still ends after everything written before it was asked for).

    Thread-safe: submit from any thread; callbacks run on the sync thread, in order.
    """

    def __init__(self, namespace: Namespace):
        self.namespace = namespace
        self.busy_since = 0.0  # monotonic start of the fdatasync running now (0: none)
        self.batch = 0
        self._queue: queue.SimpleQueue[Callable[[OSError | None], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, callback: Callable[[OSError | None], None]) -> None:
        """fdatasync the namespace's file; callback(None) once done, callback(error) if it failed."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"sync-ns{self.namespace.nsid}", daemon=True)
                self._thread.start()
        self._queue.put(callback)

    def stop(self) -> None:
        """Finish the queued Flushes, then stop the thread (if it ever started)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def describe(self) -> str:
        busy = self.busy_since
        if busy:
            return (f"fdatasync of {self.namespace.path} running for {time.monotonic() - busy:.1f} s "
                    f"({self.batch} Flushes), {self._queue.qsize()} queued")
        return f"sync thread idle, {self._queue.qsize()} Flushes queued"

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while batch[-1] is not None:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = batch[-1] is None
            callbacks = [c for c in batch if c is not None]
            if callbacks:
                self.batch, self.busy_since = len(callbacks), time.monotonic()
                error = None
                try:
                    self.namespace.sync_data()
                except OSError as exc:
                    logger.error("namespace %d: flush failed: %s", self.namespace.nsid, exc)
                    error = exc
                took, self.busy_since = time.monotonic() - self.busy_since, 0.0
                if took > SLOW_SYNC_S:
                    logger.warning("namespace %d: fdatasync of a Flush took %.1f s (%d Flushes waited on it)",
                                   self.namespace.nsid, took, len(callbacks))
                for callback in callbacks:
                    try:
                        callback(error)
                    except Exception:  # one failing callback must not starve the others
                        logger.exception("flush callback failed")
            if stopping:
                return


SLOW_SYNC_S = 1.0  # an fdatasync longer than this is logged, with what waited on it


class Namespace:
    """A namespace backed by one sparse file of size_bytes.

    Thread-safe: file I/O uses pread/pwrite at explicit offsets; flush may run concurrently.
    A Flush command goes through `syncer` (its own thread), not flush().
    """

    command_set = ""

    def __init__(self, nsid: int, path: str | os.PathLike, size_bytes: int, fsync: bool = True):
        self.nsid = nsid
        self.path = os.fspath(path)
        self.size_bytes = size_bytes - size_bytes % LBA_BYTES
        self.fsync_enabled = fsync
        self.fsyncs = 0
        self._fsync_lock = threading.Lock()
        self.fd = -1
        self.syncer = Syncer(self)

    def open(self) -> None:
        """Open (create) the backing file, 0600 (also one an older run left wider), size_bytes long."""
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(self.fd, 0o600)  # the users' KV: this node's user alone reads it
        if os.fstat(self.fd).st_size < self.size_bytes:
            os.ftruncate(self.fd, self.size_bytes)

    def close(self) -> None:
        self.syncer.stop()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def sync_data(self) -> None:
        """fdatasync the backing file (skipped when fsync is off)."""
        if self.fsync_enabled:
            os.fdatasync(self.fd)
            with self._fsync_lock:
                self.fsyncs += 1

    def flush(self) -> None:
        """NVM Flush: what was written is on stable storage when this returns."""
        self.sync_data()

    @property
    def used_bytes(self) -> int:
        return os.fstat(self.fd).st_blocks * 512

    @property
    def key_count(self) -> int:
        return 0


class BlockNamespace(Namespace):
    """NVM command set on 4,096-byte LBAs.

    Writes reach stable storage at the next Flush (a volatile write cache, as NVMe allows).
    Thread-safe: positioned reads and writes; concurrent writes to one LBA race as on a drive.
    """

    command_set = "nvm"

    @property
    def lba_count(self) -> int:
        return self.size_bytes // LBA_BYTES

    def check_range(self, slba: int, nlb: int) -> None:
        """Raise INVALID_FIELD for zero LBAs and LBA_OUT_OF_RANGE past the namespace."""
        if nlb == 0:
            raise NvmeError(st.INVALID_FIELD, "number_of_lbas is 0")
        if slba + nlb > self.lba_count:
            raise NvmeError(st.LBA_OUT_OF_RANGE, f"LBAs {slba}+{nlb} past {self.lba_count}")

    def write(self, slba: int, nlb: int, buffers: Sequence) -> None:
        """Write nlb LBAs from buffers (their total is nlb * 4096, checked by the caller)."""
        self.check_range(slba, nlb)
        write_extents(self.fd, buffers, [Extent(slba * LBA_BYTES, nlb * LBA_BYTES)])

    def read(self, slba: int, nlb: int) -> np.ndarray:
        """Read nlb LBAs into a new buffer: [nlb * 4096] uint8."""
        self.check_range(slba, nlb)
        out = new_buffer(nlb * LBA_BYTES)
        read_extents(self.fd, [Extent(slba * LBA_BYTES, nlb * LBA_BYTES)], memoryview(out))
        return out

    def deallocate(self, slba: int, nlb: int) -> None:
        """Dataset Management deallocate: the LBAs read as zeros afterwards (a punched hole)."""
        self.check_range(slba, nlb)
        offset, length = slba * LBA_BYTES, nlb * LBA_BYTES
        rc = _libc.fallocate(self.fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE,
                             ctypes.c_long(offset), ctypes.c_long(length))
        if rc != 0:
            logger.debug("punch hole failed (errno %d); writing zeros", ctypes.get_errno())
            zeros = bytes(min(length, 1 << 20))
            for pos in range(offset, offset + length, len(zeros)):
                os.pwrite(self.fd, zeros[:min(len(zeros), offset + length - pos)], pos)
