"""The key-value namespace: values on extents of the backing file, a journaled index, crc32c checks,
and read leases on keys (`storage_node.leases`: a Delete of a key another host leased fails)."""
from __future__ import annotations

import bisect
import logging
import mmap
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fabric import status as st
from fabric.status import NvmeError, Status
from kvtb.crc32c import crc32c
from storage_node import journal as jr
from storage_node.allocator import AllocationError, Extent, ExtentAllocator
from storage_node.leases import Leases
from storage_node.namespace import (
    LBA_BYTES,
    Namespace,
    byte_view,
    new_buffer,
    read_extents,
    write_extents,
)
from storage_node.replay import replay

logger = logging.getLogger(__name__)

MAX_KEY_BYTES = 16
MAP_MIN_BYTES = 1 << 20  # values from this size are sent straight from the file's mapping


@dataclass
class IndexEntry:
    """A committed value. pins counts readers; a retired entry's extents are freed at pins == 0.

    lost: the data file was cut short under it, so its bytes are gone (Retrieve fails).
    """

    length: int
    crc32c: int
    extents: tuple[Extent, ...]
    pins: int = 0
    retired: bool = False
    lost: bool = False


@dataclass
class PendingStore:
    """A Store whose data is written (or being written) to its own, not yet indexed, extents."""

    key: bytes
    length: int
    extents: tuple[Extent, ...]
    crc32c: int = 0  # of the bytes written, set by write()
    only_if_absent: bool = False
    only_if_present: bool = False


@dataclass
class PendingDelete:
    """A Delete waiting for its journal record; host: who asks (another host's lease refuses it)."""

    key: bytes
    host: str = ""


Op = PendingStore | PendingDelete


def sub_extents(extents: Sequence[Extent], offset: int, length: int) -> list[Extent]:
    """The extents holding bytes [offset, offset + length) of a value laid over `extents` in order."""
    out, pos = [], 0
    for ext in extents:
        lo, hi = max(offset, pos), min(offset + length, pos + ext.length)
        if lo < hi:
            out.append(Extent(ext.offset + lo - pos, hi - lo))
        pos += ext.length
    return out


def _range_end(value_bytes: int, offset: int, length: int, exact: bool) -> int:
    """Where a read of `length` bytes from `offset` ends in a value of value_bytes; INVALID_FIELD for a
    range outside it (exact: the whole range must fit; else it is cut at the end, 0 meaning all)."""
    if offset > value_bytes or (exact and (length == 0 or offset + length > value_bytes)):
        raise NvmeError(st.INVALID_FIELD, f"bytes [{offset}, {offset + length}) lie outside the value's "
                                          f"{value_bytes} bytes")
    return min(value_bytes, offset + length) if length else value_bytes


def check_key(key: bytes) -> None:
    """Raise the KV "invalid key size" status for an empty key or one over 16 bytes."""
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise NvmeError(st.INVALID_KEY_SIZE, f"key of {len(key)} bytes (1..{MAX_KEY_BYTES})")


class KvNamespace(Namespace):
    """Key-value command set over an extent allocator, with a journal for the index.

    Invariants: the index holds only values whose data and journal record are durable; a
    Store writes to fresh extents, so a reader never sees a half-replaced value; extents of a
    replaced or deleted value return to the allocator only when no reader holds them.
    A data file cut short under the node (damage) loses the values past its new end: they are
    marked lost and the file is made whole again, so that no read touches a page past its end.
    Thread-safe: _lock guards the index and the allocator; commit() runs on one thread.
    """

    command_set = "key_value"

    def __init__(self, nsid: int, path: str | os.PathLike, size_bytes: int, fsync: bool = True,
                 compact_min_records: int = 10_000, mapped_reads: bool = True):
        super().__init__(nsid, path, size_bytes, fsync)
        self.journal = jr.Journal(self.path + ".journal", fsync)
        self.compact_min_records = compact_min_records
        self.mapped_reads = mapped_reads
        self.integrity_errors = 0
        self.commit_phase = ""  # what commit() is doing now ("": not committing), for the stall log
        self.last_commit_s = (0.0, 0.0)  # the last commit's seconds in the data fdatasync, in the journal
        self.values_lost = 0  # to a data file cut short, or set aside at replay
        self._lock = threading.Lock()
        self._index: dict[bytes, IndexEntry] = {}
        self.leases = Leases()  # in memory only, on keys of the index
        self._sorted_keys: list[bytes] | None = None
        self._map: mmap.mmap | None = None
        self.allocator = ExtentAllocator(self.size_bytes, LBA_BYTES)

    def open(self) -> None:
        """Open the file and replay the journal into the index and the allocator."""
        found_bytes = os.stat(self.path).st_size if os.path.exists(self.path) else 0
        super().open()
        if self.mapped_reads:
            self._map = mmap.mmap(self.fd, self.size_bytes, mmap.MAP_SHARED, mmap.PROT_READ)
        records = self.journal.open()
        replayed = replay(records, self.size_bytes, LBA_BYTES)
        self._index = {k: IndexEntry(r.value_length, r.crc32c, r.extents) for k, r in replayed.entries.items()}
        used = [e for entry in self._index.values() for e in entry.extents]
        self.allocator = ExtentAllocator.from_used(self.size_bytes, used, LBA_BYTES)
        logger.info("namespace %d: replayed %d journal records, %d keys, %d bytes used",
                    self.nsid, len(records), len(self._index), self.allocator.used_bytes)
        if replayed.dropped:
            self.values_lost += len(replayed.dropped)
            logger.error("namespace %d: %d values set aside at replay (Retrieve answers \"key does not "
                         "exist\"), for example %s", self.nsid, len(replayed.dropped),
                         "; ".join(f"{k.hex()}: {why}" for k, why in list(replayed.dropped.items())[:5]))
        if found_bytes < self.size_bytes and self._index:
            self._mark_lost(found_bytes)
        damaged = bool(self.journal.damage or replayed.dropped or self.journal.legacy_records)
        if damaged or len(records) > max(self.compact_min_records, 2 * len(self._index)):
            try:  # rewritten from the index: damage and old versions gone, set-aside values forgotten
                self.journal.rewrite(jr.Record(jr.PUT, k, e.length, e.crc32c, e.extents)
                                     for k, e in self._index.items())
            except OSError as exc:  # the journal as it is still replays to the same index
                logger.error("namespace %d: journal not compacted: %s", self.nsid, exc)
            else:
                logger.info("namespace %d: journal compacted to %d records", self.nsid, len(self._index))

    def check_file(self) -> None:
        """If the data file was cut short (damage), mark the values past its end lost and regrow it."""
        with self._lock:
            self._check_file()

    def _check_file(self) -> None:
        size = os.fstat(self.fd).st_size
        if size >= self.size_bytes:
            return
        self._mark_lost(size)
        os.ftruncate(self.fd, self.size_bytes)  # pages past the cut read as zeros, never SIGBUS

    def _mark_lost(self, file_bytes: int) -> None:
        lost = [e for e in self._index.values()
                if not e.lost and max((x.end for x in e.extents), default=0) > file_bytes]
        for entry in lost:
            entry.lost = True
        self.values_lost += len(lost)
        logger.log(logging.ERROR if lost else logging.WARNING,
                   "namespace %d: data file %s is %d bytes, not %d: %d values past its end are lost "
                   "(Retrieve answers \"unrecovered read error\"); the file is grown back",
                   self.nsid, self.path, file_bytes, self.size_bytes, len(lost))

    def close(self) -> None:
        self.journal.close()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a reply still holds a view; the mapping goes with it
                logger.debug("namespace %d: mapping still in use at close", self.nsid)
            self._map = None
        super().close()

    # -- Store and Delete (the committer thread commits them) ---------------------------------

    def reserve(self, key: bytes, length: int, *, only_if_absent: bool = False,
                only_if_present: bool = False) -> PendingStore:
        """Allocate fresh extents for a value of length bytes (CAPACITY_EXCEEDED when full)."""
        check_key(key)
        with self._lock:
            present = key in self._index
            if only_if_absent and present:
                raise NvmeError(st.KEY_EXISTS)
            if only_if_present and not present:
                raise NvmeError(st.KEY_DOES_NOT_EXIST)
            try:
                extents = tuple(self.allocator.allocate(length))
            except AllocationError as exc:
                raise NvmeError(st.CAPACITY_EXCEEDED, str(exc)) from exc
        return PendingStore(key, length, extents, only_if_absent=only_if_absent,
                            only_if_present=only_if_present)

    def write(self, pending: PendingStore, buffers: Sequence) -> int:
        """Write the value's bytes to its extents (not yet durable, not yet visible); their crc32c,
        computed as they are written, becomes the pending value's."""
        self.check_file()
        pending.crc32c = write_extents(self.fd, buffers, pending.extents, 0, writeback=self.fsync_enabled)
        return pending.crc32c

    def abort(self, pending: PendingStore) -> None:
        """Give a Store's extents back (it failed before its record was written)."""
        with self._lock:
            self.allocator.free(pending.extents)

    def commit(self, ops: Sequence[Op]) -> list[Status]:
        """Make a batch durable (one data fdatasync, one journal append) and visible, in order."""
        statuses, records = self._decide(ops)
        try:
            start = time.monotonic()
            if any(isinstance(op, PendingStore) for op, s in zip(ops, statuses) if s.ok):
                self.commit_phase = "fdatasync of the data file"
                self.sync_data()
            synced = time.monotonic()
            self.commit_phase = "journal append and fdatasync"
            self.journal.append(records)
            self.last_commit_s = (synced - start, time.monotonic() - synced)
        except OSError as exc:
            logger.error("namespace %d: commit failed: %s", self.nsid, exc)
            statuses = [st.INTERNAL_ERROR if s.ok else s for s in statuses]
        finally:
            self.commit_phase = ""
        with self._lock:
            for op, status in zip(ops, statuses):
                if isinstance(op, PendingStore) and not status.ok:
                    self.allocator.free(op.extents)
                elif status.ok:
                    self._apply(op)
        return statuses

    def _decide(self, ops: Sequence[Op]) -> tuple[list[Status], list[jr.Record]]:
        """Check each op's condition against the index as the earlier ops of the batch leave it."""
        statuses, records, shadow = [], [], {}
        now = time.monotonic()
        with self._lock:
            for op in ops:
                present = shadow.get(op.key, op.key in self._index)
                if isinstance(op, PendingDelete):
                    status = st.SUCCESS if present else st.KEY_DOES_NOT_EXIST
                    if present and self.leases.held_by_other(op.key, op.host, now):
                        status = st.KEY_LEASED
                elif op.only_if_absent and present:
                    status = st.KEY_EXISTS
                elif op.only_if_present and not present:
                    status = st.KEY_DOES_NOT_EXIST
                else:
                    status = st.SUCCESS
                statuses.append(status)
                if status.ok:
                    shadow[op.key] = isinstance(op, PendingStore)
                    records.append(jr.Record(jr.PUT, op.key, op.length, op.crc32c, op.extents)
                                   if isinstance(op, PendingStore) else jr.Record(jr.DELETE, op.key))
        return statuses, records

    def _apply(self, op: Op) -> None:
        old = self._index.pop(op.key, None)
        if isinstance(op, PendingStore):
            self._index[op.key] = IndexEntry(op.length, op.crc32c, op.extents)
        else:
            self.leases.drop(op.key)
        if old is None or not isinstance(op, PendingStore):
            self._sorted_keys = None  # the set of keys changed
        if old is not None:
            self._release(old, retire=True)

    def _release(self, entry: IndexEntry, retire: bool = False) -> None:
        if retire:
            entry.retired = True
        if entry.retired and entry.pins == 0:
            self.allocator.free(entry.extents)

    # -- Retrieve, Exist, List ----------------------------------------------------------------

    def retrieve(self, key: bytes, max_bytes: int = 0, check_guard: bool = True,
                 offset: int = 0) -> tuple[object, int, int]:
        """(bytes from offset on, at most max_bytes (0: to the end), value length, crc32c);
        UNRECOVERED_READ_ERROR on a crc mismatch, INVALID_FIELD for an offset past the value's end.

        check_guard=False skips the crc32c check, for a host that checks it itself on arrival.

        A large single-extent value comes back as a numpy view of the file's mapping (no copy):
        its extents stay pinned until that view is freed (a ZeroMQ message holds it until the
        bytes have left). Other values are read into a new buffer.
        """
        return self._read(key, offset, max_bytes, check_guard, exact=False)

    def retrieve_range(self, key: bytes, offset: int, length: int,
                       check_guard: bool = True) -> tuple[object, int, int]:
        """(bytes [offset, offset + length) of the value, value length, crc32c), as retrieve(); the range
        must lie inside the value (INVALID_FIELD otherwise). With check_guard the whole value's crc32c
        is checked first: only a whole value can vouch for a part of it."""
        return self._read(key, offset, length, check_guard, exact=True)

    def retrieve_spans(self, key: bytes, spans: Sequence[tuple[int, int]],
                       check_guard: bool = True) -> list[memoryview | NvmeError]:
        """Each span (offset, length) of key's value, read once for them all: one read of the bytes
        that cover them (and with check_guard one crc32c check of the whole value), then a view per span
        (views of a mapped value keep it pinned, as retrieve's do). A span outside the value gets its
        INVALID_FIELD error in its place; KEY_DOES_NOT_EXIST and a failed check raise for them all."""
        check_key(key)
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                raise NvmeError(st.KEY_DOES_NOT_EXIST)
            length = entry.length
        bounds: list[tuple[int, int] | NvmeError] = []
        for offset, n in spans:
            try:
                bounds.append((offset, _range_end(length, offset, n, exact=True)))
            except NvmeError as exc:
                bounds.append(exc)
        inside = [b for b in bounds if not isinstance(b, NvmeError)]
        if not inside:
            return bounds
        lo, hi = min(b[0] for b in inside), max(b[1] for b in inside)
        data, _, _ = self._read(key, lo, hi - lo, check_guard, exact=True)
        view = byte_view(data)  # slices of it keep `data` (and a mapped value's pin) alive
        return [b if isinstance(b, NvmeError) else view[b[0] - lo:b[1] - lo] for b in bounds]

    def _read(self, key: bytes, offset: int, length: int, check_guard: bool, exact: bool) -> tuple[object, int, int]:
        check_key(key)
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                raise NvmeError(st.KEY_DOES_NOT_EXIST)
            end = _range_end(entry.length, offset, length, exact)
            mappable = self._map is not None and self._mappable(entry)
            if mappable:  # a page of the mapping past the file's end is SIGBUS: check first
                self._check_file()
            if entry.lost:
                raise NvmeError(st.UNRECOVERED_READ_ERROR, "value lost: the data file was cut short under it")
            entry.pins += 1
        mapped = self._mapped(entry) if mappable else None
        whole = check_guard or (offset == 0 and end == entry.length)
        try:
            out = mapped if mapped is not None else self._read_copy(entry, 0 if whole else offset,
                                                                     entry.length if whole else end - offset)
            intact = not check_guard or crc32c(out) == entry.crc32c
        except EOFError as exc:  # a copy read found the file's end: it was cut short
            self._unpin(entry)
            self.check_file()
            raise NvmeError(st.UNRECOVERED_READ_ERROR, f"value lost: {exc}") from exc
        except BaseException:
            self._unpin(entry)
            raise
        if mapped is None or not intact:
            self._unpin(entry)
        if not intact:
            self.integrity_errors += 1
            logger.error("namespace %d: crc32c mismatch for key %s", self.nsid, key.hex())
            raise NvmeError(st.UNRECOVERED_READ_ERROR, "stored value fails its crc32c")
        if mapped is None:
            view = memoryview(out)
            return (view[offset:end] if whole else view), entry.length, entry.crc32c
        view = mapped[offset:end]
        weakref.finalize(view, self._unpin, entry)  # unpinned when the last holder lets go
        return view, entry.length, entry.crc32c

    def maps(self, key: bytes) -> bool:
        """True when Retrieve would send key's value straight from the file's mapping."""
        with self._lock:
            entry = self._index.get(key)
            return entry is not None and self._map is not None and self._mappable(entry)

    @staticmethod
    def _mappable(entry: IndexEntry) -> bool:
        return len(entry.extents) == 1 and entry.length >= MAP_MIN_BYTES

    def _mapped(self, entry: IndexEntry) -> np.ndarray | None:
        """A view of the page cache holding entry's value, when it is large and in one extent."""
        if self._map is None or not self._mappable(entry):
            return None
        return np.frombuffer(self._map, np.uint8, entry.length, entry.extents[0].offset)

    def _read_copy(self, entry: IndexEntry, offset: int, length: int) -> np.ndarray:
        out = new_buffer(length)  # [length] uint8: bytes [offset, offset + length) of the value
        read_extents(self.fd, sub_extents(entry.extents, offset, length), memoryview(out), past_end="raise")
        return out

    def _unpin(self, entry: IndexEntry) -> None:
        with self._lock:
            entry.pins -= 1
            self._release(entry)

    def value_length(self, key: bytes) -> int:
        """The stored value's length (0 when key is absent)."""
        with self._lock:
            entry = self._index.get(key)
            return entry.length if entry else 0

    def lease(self, keys: Sequence[bytes], host: str, lease_s: float) -> int:
        """Lease to host each of keys the index holds, for lease_s seconds from now; how many."""
        now = time.monotonic()
        with self._lock:
            held = [k for k in keys if k in self._index]
            self.leases.grant(held, host, now + lease_s, now)
        return len(held)

    def exist(self, key: bytes) -> bool:
        """True when key holds a committed value."""
        check_key(key)
        with self._lock:
            return key in self._index

    def list_keys(self, start_key: bytes = b"", max_keys: int = 1000) -> list[bytes]:
        """Keys greater than start_key in byte order, at most max_keys."""
        with self._lock:
            if self._sorted_keys is None:
                self._sorted_keys = sorted(self._index)
            keys = self._sorted_keys
            i = bisect.bisect_right(keys, start_key) if start_key else 0
            return keys[i:i + max_keys]

    @property
    def key_count(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        return self.allocator.used_bytes
