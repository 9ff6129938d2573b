"""Extent allocator for the key-value namespace: best fit, scatter when fragmented, coalescing frees."""
from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import NamedTuple


class Extent(NamedTuple):
    """A byte range of the namespace file: [offset, offset + length)."""

    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


class AllocationError(Exception):
    """Not enough free space for the request."""


class ExtentAllocator:
    """Free space of a file of capacity_bytes, in units of block_bytes.

    Invariants: free extents are sorted by offset, block-aligned, non-empty, never adjacent
    (frees coalesce) and never overlap an allocated extent; free_bytes + used_bytes ==
    capacity. Not thread-safe: the namespace's lock guards it.
    """

    def __init__(self, capacity_bytes: int, block_bytes: int = 4096):
        if block_bytes <= 0 or capacity_bytes < 0:
            raise ValueError(f"block_bytes {block_bytes} must be positive, capacity_bytes {capacity_bytes} not negative")
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes - capacity_bytes % block_bytes
        self._free: list[Extent] = [Extent(0, self.capacity_bytes)] if self.capacity_bytes else []
        self.free_bytes = self.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self.capacity_bytes - self.free_bytes

    def round_up(self, nbytes: int) -> int:
        """nbytes rounded up to whole blocks (at least one block)."""
        blocks = max(1, -(-nbytes // self.block_bytes))
        return blocks * self.block_bytes

    def allocate(self, nbytes: int) -> list[Extent]:
        """Extents covering nbytes: one best-fit extent, else the largest free ones in turn."""
        need = self.round_up(nbytes)
        if need > self.free_bytes:
            raise AllocationError(f"need {need} bytes, {self.free_bytes} free")
        best = None
        for i, ext in enumerate(self._free):
            if ext.length >= need and (best is None or ext.length < self._free[best].length):
                best = i
        if best is not None:
            return [self._take(best, need)]
        taken = []
        while need:
            i = max(range(len(self._free)), key=lambda j: self._free[j].length)
            part = min(need, self._free[i].length)
            taken.append(self._take(i, part))
            need -= part
        return sorted(taken)

    def _take(self, index: int, nbytes: int) -> Extent:
        ext = self._free[index]
        if ext.length == nbytes:
            del self._free[index]
        else:
            self._free[index] = Extent(ext.offset + nbytes, ext.length - nbytes)
        self.free_bytes -= nbytes
        return Extent(ext.offset, nbytes)

    def free(self, extents: Iterable[Extent]) -> None:
        """Return extents to the free list, merging with their neighbours."""
        for ext in extents:
            self._free_one(Extent(*ext))

    def _free_one(self, ext: Extent) -> None:
        if ext.length <= 0 or ext.offset % self.block_bytes or ext.offset < 0 or ext.end > self.capacity_bytes:
            raise ValueError(f"cannot free {ext}: empty, unaligned or outside the {self.capacity_bytes} bytes")
        i = bisect.bisect_left(self._free, ext)
        if (i > 0 and self._free[i - 1].end > ext.offset) or (
                i < len(self._free) and self._free[i].offset < ext.end):
            raise ValueError(f"double free of {ext}")
        offset, end = ext.offset, ext.end
        if i < len(self._free) and self._free[i].offset == end:
            end = self._free.pop(i).end
        if i > 0 and self._free[i - 1].end == offset:
            i -= 1
            offset = self._free.pop(i).offset
        self._free.insert(i, Extent(offset, end - offset))
        self.free_bytes += ext.length

    def free_extents(self) -> list[Extent]:
        """A copy of the free list, sorted by offset."""
        return list(self._free)

    def to_state(self) -> dict:
        """A JSON-able snapshot (for a journal checkpoint)."""
        return {"capacity_bytes": self.capacity_bytes, "block_bytes": self.block_bytes,
                "free": [list(e) for e in self._free]}

    @classmethod
    def from_state(cls, state: dict) -> ExtentAllocator:
        """Rebuild an allocator from to_state()'s output."""
        alloc = cls(state["capacity_bytes"], state["block_bytes"])
        alloc._free = [Extent(*e) for e in state["free"]]
        alloc.free_bytes = sum(e.length for e in alloc._free)
        return alloc

    @classmethod
    def from_used(cls, capacity_bytes: int, used: Iterable[Extent],
                  block_bytes: int = 4096) -> ExtentAllocator:
        """An allocator whose free space is everything not in used (replay rebuilds it so)."""
        alloc = cls(capacity_bytes, block_bytes)
        free, cursor = [], 0
        for ext in sorted(Extent(*e) for e in used):
            if ext.offset < cursor:
                raise ValueError(f"overlapping extents at {ext.offset}")
            if ext.offset > cursor:
                free.append(Extent(cursor, ext.offset - cursor))
            cursor = ext.end
        if cursor < alloc.capacity_bytes:
            free.append(Extent(cursor, alloc.capacity_bytes - cursor))
        alloc._free = free
        alloc.free_bytes = sum(e.length for e in free)
        return alloc
