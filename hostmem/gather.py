"""Scatter-gather lists over a region: which ranges go out as views, which are joined, the copies.

A chunk may be many ranges of the region (a plain region's strided rows; a block of the paged
pool is two: its token ids and its one KV extent). Sent as one ZeroMQ frame per range, the
chunk would cost both ends a few Python calls per frame; pyzmq copies every frame under its
copy threshold (64 KiB) into a ZeroMQ message anyway; and ZeroMQ moves a message of many
mid-sized frames markedly slower over TCP than the same bytes in a few large ones. So a PUT
sends each range of at least `view_min_bytes` (1 MiB) as a view of the region (no copy) and
joins each run of smaller ranges into one buffer with one copy, as a NIC's DMA engine gathers
a scatter-gather list into its packets. A GET copies the received bytes into the ranges, once.
Runs of ranges of one length at one stride (strided rows) move in one numpy call per block.

Both directions fold the crc32c into the copy loop: each block of at most BLOCK_BYTES is
checksummed right after it was copied, while it is still in the CPU's cache, so the data
crosses memory once for the copy and not again for the checksum.

`hostmem.dma` runs these copies with its compiled engine where it was built; the numpy copies
here are its fallback and the reference its tests compare with.

Pure: numpy only (no zmq, grpc or torch); the crc function is passed in.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

Range = tuple[int, int]  # (offset, length) in bytes
Extend = Callable[[int, object], int]  # crc32c so far, next buffer -> crc32c
Join = Callable[[np.ndarray, "Piece", int], tuple[np.ndarray, int]]  # gather()'s shape, crc built in
VIEW_MIN_BYTES = 1 << 20  # ranges from this size go out as views of the region
BLOCK_BYTES = 512 << 10    # copied, then checksummed while still in cache


class Run(NamedTuple):
    """`count` ranges of `length` bytes, the i-th at `first + i * stride` (stride >= length)."""

    first: int
    length: int
    stride: int
    count: int

    @property
    def nbytes(self) -> int:
        return self.length * self.count


def coalesce(ranges: Sequence[Range]) -> list[Range]:
    """The ranges in order, empty ones dropped and each one that starts where the last ended merged.

    ValueError for a negative length.
    """
    out: list[Range] = []
    end = -1
    for offset, length in ranges:
        if length <= 0:
            if length < 0:
                raise ValueError(f"range ({offset}, {length}) has a negative length")
            continue
        if offset == end:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((offset, length))
        end = offset + length
    return out


def runs(ranges: Sequence[Range]) -> list[Run]:
    """Split ranges (in order) into maximal runs of one length at one non-overlapping stride."""
    out: list[Run] = []
    first = length = stride = count = 0
    for offset, n in ranges:
        if count == 1 and n == length and offset - first >= n:
            stride, count = offset - first, 2
            continue
        if count > 1 and n == length and offset == first + count * stride:
            count += 1
            continue
        if count:
            out.append(Run(first, length, stride, count))
        first, length, stride, count = offset, n, n, 1
    if count:
        out.append(Run(first, length, stride, count))
    return out


def runs_of(ranges: Sequence[Range]) -> list[Run]:
    """The copy plan of a scatter-gather list: runs(coalesce(ranges))."""
    return runs(coalesce(ranges))


def span(todo: Sequence[Run]) -> tuple[int, int]:
    """(lowest offset, highest end) of runs; (0, 0) for none."""
    if not todo:
        return 0, 0
    return (min(r.first for r in todo),
            max(r.first + (r.count - 1) * r.stride + r.length for r in todo))


class Piece(NamedTuple):
    """Part of a PUT's payload: one large range sent as a view, or small ones joined by a copy."""

    view: bool
    runs: tuple[Run, ...]

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.runs)


def plan(todo: Sequence[Run], view_min_bytes: int = VIEW_MIN_BYTES) -> list[Piece]:
    """The pieces of a payload given as runs, in order: each range of view_min_bytes or more alone,
    the runs of smaller ones between them joined."""
    pieces: list[Piece] = []
    small: list[Run] = []
    for run in todo:
        if run.length < view_min_bytes:
            small.append(run)
            continue
        if small:
            pieces.append(Piece(False, tuple(small)))
            small = []
        pieces.extend(Piece(True, (Run(run.first + i * run.stride, run.length, run.length, 1),))
                      for i in range(run.count))
    if small:
        pieces.append(Piece(False, tuple(small)))
    return pieces


def _rows(mem: np.ndarray, run: Run) -> np.ndarray:
    """mem's bytes of run as a [count, length] array view (mem is 1-D uint8; run is in bounds)."""
    return np.ndarray((run.count, run.length), np.uint8, mem, run.first, (run.stride, 1))


def _copy_rows(rows: np.ndarray, flat: np.ndarray, run: Run, into_rows: bool, crc: int,
               extend: Extend | None) -> int:
    """Copy a run between its rows and a flat buffer, block by block, checksumming the flat side."""
    flat = flat.reshape(run.count, run.length)
    step = max(1, BLOCK_BYTES // run.length)
    for i in range(0, run.count, step):
        if into_rows:
            np.copyto(rows[i:i + step], flat[i:i + step])
        else:
            np.copyto(flat[i:i + step], rows[i:i + step])
        if extend is not None:
            crc = extend(crc, flat[i:i + step])
    return crc


def gather(mem: np.ndarray, piece: Piece, crc: int = 0,
           extend: Extend | None = None) -> tuple[np.ndarray, int]:
    """(one new buffer with the piece's ranges back to back: [piece.nbytes] uint8, crc extended by it)."""
    out = np.empty(piece.nbytes, dtype=np.uint8)
    return out, gather_into(mem, piece.runs, out, crc, extend)


def gather_into(mem: np.ndarray, todo: Sequence[Run], out: np.ndarray, crc: int = 0,
                extend: Extend | None = None) -> int:
    """Copy the runs of mem back to back into out ([their bytes] uint8); crc extended by them."""
    pos = 0
    for run in todo:
        crc = _copy_rows(_rows(mem, run), out[pos:pos + run.nbytes], run, False, crc, extend)
        pos += run.nbytes
    return crc


def frames(mem: np.ndarray, todo: Sequence[Run], crc: int = 0, extend: Extend | None = None,
           view_min_bytes: int = VIEW_MIN_BYTES, join: Join | None = None) -> tuple[list, int]:
    """The payload of runs as buffers to send (views of mem for large ranges, joined copies for
    the others), and crc extended over them in order. join(mem, piece, crc) makes each joined
    copy (default: gather() with extend; `hostmem.dma` passes its engine's)."""
    out = []
    for piece in plan(todo, view_min_bytes):
        if piece.view:
            run = piece.runs[0]
            buf = mem[run.first:run.first + run.length]
            if extend is not None:
                crc = extend(crc, buf)
        elif join is not None:
            buf, crc = join(mem, piece, crc)
        else:
            buf, crc = gather(mem, piece, crc, extend)
        out.append(buf)
    return out, crc


def cut(todo: Sequence[Run], start: int, nbytes: int) -> list[Run]:
    """The runs holding bytes [start, start + nbytes) of todo's byte stream, in order: whole rows
    as runs, a row cut at either end as a run of one (for a data PDU that lands mid-stream)."""
    out: list[Run] = []
    end, pos = start + nbytes, 0
    for run in todo:
        lo, hi = max(start, pos) - pos, min(end, pos + run.nbytes) - pos
        pos += run.nbytes
        if hi <= lo:
            if pos >= end:
                break
            continue
        (i, a), (j, b) = divmod(lo, run.length), divmod(hi, run.length)
        if i == j:
            out.append(Run(run.first + i * run.stride + a, b - a, b - a, 1))
            continue
        if a:
            out.append(Run(run.first + i * run.stride + a, run.length - a, run.length - a, 1))
            i += 1
        if j > i:
            out.append(Run(run.first + i * run.stride, run.length, run.stride, j - i))
        if b:
            out.append(Run(run.first + j * run.stride, b, b, 1))
    return out


def scatter(source, mem: np.ndarray, todo: Sequence[Run], crc: int = 0,
            extend: Extend | None = None) -> tuple[int, int]:
    """Copy a contiguous source (any buffer) into the runs of mem, in order, checksumming the source
    block by block as it goes; (bytes copied, crc extended over the source).

    ValueError when the source does not hold exactly the runs' bytes; nothing is copied then.
    """
    src = np.frombuffer(source, dtype=np.uint8)
    total = sum(r.nbytes for r in todo)
    if total != src.size:
        raise ValueError(f"source of {src.size} bytes for ranges of {total}")
    pos = 0
    for run in todo:
        crc = _copy_rows(_rows(mem, run), src[pos:pos + run.nbytes], run, True, crc, extend)
        pos += run.nbytes
    return pos, crc
