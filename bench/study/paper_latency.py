"""The paper's Fig. 4 here: latency by transfer size, the storage node's against the raw disk's under it.

The paper measured its NVMe drives with FIO, 512 B to 128 MB. Here, on the filesystem the storage node
writes to, one operation at a time:

- node_store / node_retrieve: a Store through the fabric until its durable acknowledgement, and a Retrieve
  of it (the node serves it from the page cache it was just written through), by the benchmarks' own
  authenticated fabric client;
- raw_write: os.pwrite of the value into a fresh file then os.fsync (what a Store must at least do);
- raw_read: os.preadv of it after posix_fadvise(DONTNEED) dropped it from the page cache (the disk's read,
  as FIO's direct reads see it); raw_read_cached: the same read again, from the page cache.

A repeat's value at a size is the median of OPS_PER_REPEAT operations for sizes up to 256 KiB, one above.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from bench.stats import median

KIB, MIB = 1 << 10, 1 << 20
FIG4_SIZES = tuple(512 * 8 ** k for k in range(7))  # 512 B, 4 KiB, 32 KiB, 256 KiB, 2 MiB, 16 MiB, 128 MiB
SIZES = {"full": tuple(sorted(FIG4_SIZES + (64 * MIB,))),
         "quick": FIG4_SIZES[:6] + (32 * MIB,),
         "smoke": (512, 32 * KIB, 2 * MIB)}
PATHS = ("node_store", "node_retrieve", "raw_write", "raw_read", "raw_read_cached")
OPS_PER_REPEAT = 5
SMALL = 256 * KIB


def ops_for(size: int) -> int:
    return OPS_PER_REPEAT if size <= SMALL else 1


class RawFile:
    """One file on the node's filesystem: write+fsync, uncached and cached reads, each timed."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"fig4-{uuid.uuid4().hex[:8]}.bin"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    def write(self, data: memoryview) -> float:
        os.ftruncate(self.fd, 0)  # untimed: a fresh allocation, as a new value's
        start = time.perf_counter()
        done = 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], done)
        os.fsync(self.fd)
        return time.perf_counter() - start

    def read(self, into: memoryview, cached: bool) -> float:
        if not cached:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # untimed: off the page cache
        start = time.perf_counter()
        done = 0
        while done < len(into):
            got = os.preadv(self.fd, [into[done:]], done)
            if got == 0:
                raise OSError(f"short read at {done} of {len(into)}")
            done += got
        return time.perf_counter() - start

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def _node_ops(admin, nsid: int, data: memoryview) -> tuple[float, float]:
    key = f"f4-{uuid.uuid4().hex[:12]}".encode()  # a node takes keys of 16 bytes at most
    start = time.perf_counter()
    admin.store(nsid, key, [data])
    stored = time.perf_counter()
    got = admin.retrieve(nsid, key)
    end = time.perf_counter()
    if sum(f.buffer.nbytes for f in got.frames) != len(data):
        raise RuntimeError(f"retrieved {sum(f.buffer.nbytes for f in got.frames)} bytes, stored {len(data)}")
    admin.delete(nsid, key)
    return stored - start, end - stored


def measure_size(admin, nsid: int, raw: RawFile, size: int, rep: int) -> list[dict]:
    """One repeat at one size: each path's median over ops_for(size) operations (node and raw alternating)."""
    import numpy as np

    data = memoryview(np.random.default_rng(size + rep).integers(0, 256, size, dtype=np.uint8))
    into = memoryview(np.zeros(size, dtype=np.uint8))
    got: dict[str, list[float]] = {p: [] for p in PATHS}
    for op in range(ops_for(size)):
        for side in (("node", "raw") if (op + rep) % 2 == 0 else ("raw", "node")):
            if side == "node":
                store, retrieve = _node_ops(admin, nsid, data)
                got["node_store"].append(store)
                got["node_retrieve"].append(retrieve)
            else:
                got["raw_write"].append(raw.write(data))
                got["raw_read"].append(raw.read(into, cached=False))
                got["raw_read_cached"].append(raw.read(into, cached=True))
    return [{"path": p, "bytes": size, "rep": rep, "seconds": median(v), "ops": len(v)} for p, v in got.items()]


def measure(admin, nsid: int, directory: Path, sizes: Sequence[int], repeats: int, progress) -> list[dict]:
    """Every size, `repeats` times (the sizes' order reversed every other repeat); the samples."""
    raw = RawFile(directory)
    samples: list[dict] = []
    try:
        for rep in range(repeats):
            for size in (sizes if rep % 2 == 0 else list(reversed(sizes))):
                samples += measure_size(admin, nsid, raw, size, rep)
            progress.update(note=f"Fig. 4 repeat {rep + 1}")
    finally:
        raw.close()
    return samples


def curves(samples: Sequence[dict]) -> dict[str, dict[int, list[float]]]:
    """path -> size -> the repeats' seconds (pure)."""
    out: dict[str, dict[int, list[float]]] = {}
    for s in samples:
        out.setdefault(s["path"], {}).setdefault(int(s["bytes"]), []).append(float(s["seconds"]))
    return out
