"""A registered memory region: named shared memory mapped by its owner and by the agent.

The compute node creates the region (its "GPU memory"); the agent attaches to the same
name (the "PCIe peer-to-peer" link). Both use plain mmap on /dev/shm rather than
multiprocessing.shared_memory, whose resource tracker would unlink the region when an
attaching process exits (Python < 3.13).

The region is 0600 (its owner's user only). Its creator holds an advisory `flock` on it for its
lifetime, so a region whose lock can be taken has lost its owner (a kill -9): the owner's next
start unlinks it (hostmem.region_reclaim).

Counters live in the region as 16-byte records, [success u64, error u64]. Each counter has
one writer: the compute node stores generations into PUT trigger counters; the agent bumps
completion counters. Aligned 8-byte stores are single machine stores, so a reader never sees
a torn value; an add is a read and a store by that one writer.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os
from pathlib import Path

import numpy as np

# Where named regions live: /dev/shm, or a directory both processes mount (KVTB_SHM_DIR; the
# swarm deployment shares a tmpfs volume because swarm services cannot share an IPC namespace).
logger = logging.getLogger(__name__)

SHM_DIR = Path(os.environ.get("KVTB_SHM_DIR", "/dev/shm"))
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+ (Python 3.11 does not name it)


class RegionError(ValueError):
    """An access outside the region, or a region that cannot be mapped."""


def _shm_path(name: str) -> Path:
    if not name or "/" in name.strip("/"):
        raise RegionError(f"invalid shared memory name {name!r}")
    return SHM_DIR / name.strip("/")


class Region:
    """A mapped region with bounds-checked views and fi_cntr-like counters.

    Thread-safety: views may be used from any thread; a counter must have one writer.
    """

    def __init__(self, name: str, size: int, counter_offset: int, counter_count: int,
                 *, create: bool = False):
        self.name = name
        self.size = size
        self.path = _shm_path(name)
        self.owner = create
        if size <= 0:
            raise RegionError(f"region size must be positive, got {size}")
        if counter_offset < 0 or counter_offset + counter_count * 16 > size or counter_offset % 8:
            raise RegionError(f"counter page [{counter_offset}, +{counter_count * 16}) "
                              f"does not fit in a region of {size} bytes (or is unaligned)")
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except FileExistsError as exc:
            raise RegionError(f"shared memory {name!r} already exists") from exc
        except FileNotFoundError as exc:
            raise RegionError(f"shared memory {name!r} does not exist") from exc
        self._lock_fd = -1  # the creator's: open, and locked, until close()
        try:
            if create:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file of our own making: never held
                os.fchmod(fd, 0o600)
                os.ftruncate(fd, size)
            actual = os.fstat(fd).st_size
            if actual < size:
                raise RegionError(f"shared memory {name!r} has {actual} bytes, expected {size}")
            self._mmap = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            if create:
                self.path.unlink(missing_ok=True)
            raise
        if create:
            self._lock_fd = fd
        else:
            os.close(fd)
        self.buffer = memoryview(self._mmap)
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)  # [size] uint8: the same bytes
        # counters: [counter, success|error] uint64
        self.counters = np.frombuffer(self._mmap, dtype=np.uint64, count=counter_count * 2,
                                      offset=counter_offset).reshape(counter_count, 2)
        self.counter_count = counter_count

    @classmethod
    def create(cls, name: str, size: int, counter_offset: int, counter_count: int) -> Region:
        return cls(name, size, counter_offset, counter_count, create=True)

    @classmethod
    def attach(cls, name: str, size: int, counter_offset: int, counter_count: int) -> Region:
        return cls(name, size, counter_offset, counter_count, create=False)

    # -- memory
    def check(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise RegionError(f"range [{offset}, {offset + length}) is outside the region "
                              f"{self.name!r} of {self.size} bytes")

    def view(self, offset: int, length: int) -> memoryview:
        """A zero-copy view of [offset, offset + length)."""
        self.check(offset, length)
        return self.buffer[offset:offset + length]

    def write(self, offset: int, data) -> None:
        """Copy data (any buffer) into the region at offset."""
        src = memoryview(data).cast("B")
        self.check(offset, src.nbytes)
        self.buffer[offset:offset + src.nbytes] = src

    def populate(self) -> bool:
        """Map every page of the region into this process now, allocating those not yet allocated
        (Linux 5.14+'s MADV_POPULATE_WRITE), so that no copy into it later stops at a page fault: a
        GPU's KV cache is memory allocated up front, and a NIC's DMA into it never faults (`kvtb bench
        landing` times a first copy into unmapped and mapped pages). False where it is not available
        (the pages then fault in on first use, as before) or the memory is not there."""
        try:
            self._mmap.madvise(MADV_POPULATE_WRITE, 0, self.size)
        except (AttributeError, OSError, ValueError) as exc:
            logger.info("region %s: its pages were not mapped up front (%s); they fault in when first used",
                        self.name, exc)
            return False
        return True

    # -- counters
    def _check_counter(self, counter: int) -> None:
        if not 0 <= counter < self.counter_count:
            raise RegionError(f"counter {counter} out of range [0, {self.counter_count})")

    def read_counter(self, counter: int) -> tuple[int, int]:
        """(success, error)."""
        self._check_counter(counter)
        row = self.counters[counter]
        return int(row[0]), int(row[1])

    def counter_total(self, counter: int) -> int:
        """success + error: what a threshold is compared with."""
        success, error = self.read_counter(counter)
        return success + error

    def store_counter(self, counter: int, success: int, error: int | None = None) -> None:
        """A plain store (the GPU thread's flag write)."""
        self._check_counter(counter)
        self.counters[counter, 0] = success
        if error is not None:
            self.counters[counter, 1] = error

    def add_counter(self, counter: int, success: int = 0, error: int = 0) -> tuple[int, int]:
        self._check_counter(counter)
        if success:
            self.counters[counter, 0] += np.uint64(success)
        if error:
            self.counters[counter, 1] += np.uint64(error)
        return self.read_counter(counter)

    # -- lifetime
    def close(self) -> None:
        """Unmap; the owner also removes the shared memory name."""
        self.counters = self.array = None  # drop the numpy exports before closing the mmap
        try:
            self.buffer.release()
            self._mmap.close()
        except BufferError:
            pass  # a view is still alive somewhere (e.g. a frame in flight); the GC will unmap
        if self.owner:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # after the unlink: a region without its name is nobody's to reclaim
            self._lock_fd = -1

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
