"""The data path's copy engine: scatter-gather copies between a region and contiguous buffers, with
the crc32c folded in, and a MAC fed each block right after it was copied.

Two engines do the same copies and give the same crc32c:
- "compiled" (hostmem/_dma.c, built by `pip install` when a C compiler is there): copies each
  row in pieces and checksums each piece from L1 at once, with the GIL released;
- "numpy" (hostmem.gather with kvtb.crc32c): copies blocks of 512 KiB, then checksums each.

The compiled one is used when it was built and the CPU has SSE4.2; KVTB_DMA=numpy picks numpy
(to compare the two, or to rule the compiled one out). ENGINE says which one runs.

A MAC (any hasher with update(buffer), e.g. keyed BLAKE3, which releases the GIL) is fed the
contiguous side in order, in blocks of MAC_BLOCK_BYTES, each right after its copy while it is
still in the CPU's cache; ranges sent as views of the region are hashed where they lie. A crc of
None skips the crc32c (a reader that checks a MAC instead needs none).

A restore's landing (`lander`): with the compiled engine, one C call copies a piece of a block's KV
into the region and feeds each part's keyed BLAKE3 (hostmem/_lander.c, the vendored BLAKE3) without
the GIL; with numpy, smartnic.landing does the same part by part from Python, the reference.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from kvtb import crc32c as _crc
from hostmem import gather

try:
    from hostmem import _dma
except ImportError:  # not built (no C compiler, or not x86-64)
    _dma = None
try:
    from hostmem import _lander
except ImportError:  # not built (no C compiler, or not x86-64)
    _lander = None

ENGINES = ("compiled", "numpy")
# Copied, then hashed while still in cache (L3). BLAKE3 is compute-bound here (AVX2, about 2.6 GB/s a
# core against 12 GB/s for the copy), so hashing from L1 or L2 saves nothing; blocks of 1 MiB need
# the fewest calls (measured: 64 KiB 2.1, 256 KiB 2.3, 1 MiB 2.5, 2 MiB 2.6 GB/s for a GET's copy+MAC).
MAC_BLOCK_BYTES = 1 << 20


def _choose(wanted: str | None) -> str:
    if wanted not in (None, "", *ENGINES):
        raise ValueError(f"KVTB_DMA={wanted!r}: expected one of {', '.join(ENGINES)}")
    available = _dma is not None and _dma.HARDWARE_CRC
    if wanted == "compiled" and not available:
        raise ValueError("KVTB_DMA=compiled, but hostmem._dma was not built or this CPU has no SSE4.2")
    return wanted or ("compiled" if available else "numpy")


ENGINE = _choose(os.environ.get("KVTB_DMA"))


def lander(targets: Sequence[gather.Run], kv_base: int, part_bytes: int, parts: int, key: bytes, prefix: bytes,
           engine: str | None = None):
    """A compiled landing for one block's KV (hostmem/_lander.c), or None where the engine is numpy or
    it was not built (the caller then copies and hashes part by part). targets: the block's runs,
    its KV from byte kv_base on, in `parts` parts of part_bytes; key and prefix: each part's keyed
    BLAKE3 starts with prefix, then the part's number (4 bytes, little-endian)."""
    if (engine or ENGINE) != "compiled" or _lander is None:
        return None
    return _lander.Lander(targets, kv_base, part_bytes, parts, key, prefix)


def scatter(source, mem: np.ndarray, todo: Sequence[gather.Run], crc: int | None = 0,
            engine: str | None = None, mac=None) -> tuple[int, int | None]:
    """Copy a contiguous source into the runs of mem, in order; (bytes copied, crc extended over
    the source, or None when crc is None), feeding mac the source block by block. ValueError,
    with nothing copied, when the source does not hold exactly the runs' bytes or a run lies
    outside mem."""
    if mac is None:
        return _scatter(source, mem, todo, crc, engine)
    _check_bounds(mem, todo)
    src = memoryview(source).cast("B")
    if src.nbytes != sum(r.nbytes for r in todo):
        raise ValueError(f"source of {src.nbytes} bytes for runs of {sum(r.nbytes for r in todo)}")
    for start in range(0, src.nbytes, MAC_BLOCK_BYTES):
        block = src[start:start + MAC_BLOCK_BYTES]
        _, crc = _scatter(block, mem, gather.cut(todo, start, block.nbytes), crc, engine)
        mac.update(block)
    return src.nbytes, crc


def _scatter(source, mem: np.ndarray, todo: Sequence[gather.Run], crc: int | None,
             engine: str | None) -> tuple[int, int | None]:
    if (engine or ENGINE) == "compiled":
        crc = _dma.scatter(source, mem, todo, crc)
        return memoryview(source).nbytes, crc
    _check_bounds(mem, todo)
    nbytes, out = gather.scatter(source, mem, todo, crc or 0, None if crc is None else _crc.extend)
    return nbytes, None if crc is None else out


def gather_piece(mem: np.ndarray, piece: gather.Piece, crc: int | None = 0,
                 engine: str | None = None, mac=None) -> tuple[np.ndarray, int | None]:
    """(one new buffer with the piece's ranges back to back, crc extended over it), feeding mac
    each block of the buffer right after it was copied."""
    out = np.empty(piece.nbytes, dtype=np.uint8)  # [piece.nbytes] uint8
    if mac is None:
        return out, _gather_into(mem, piece.runs, out, crc, engine)
    for start in range(0, piece.nbytes, MAC_BLOCK_BYTES):
        block = out[start:start + MAC_BLOCK_BYTES]
        crc = _gather_into(mem, gather.cut(piece.runs, start, block.size), block, crc, engine)
        mac.update(block)
    return out, crc


def _gather_into(mem: np.ndarray, todo: Sequence[gather.Run], out: np.ndarray, crc: int | None,
                 engine: str | None) -> int | None:
    if (engine or ENGINE) == "compiled":
        return _dma.gather(mem, todo, out, crc)
    _check_bounds(mem, todo)
    if out.size != sum(r.nbytes for r in todo):
        raise ValueError(f"out of {out.size} bytes for runs of {sum(r.nbytes for r in todo)}")
    out_crc = gather.gather_into(mem, todo, out, crc or 0, None if crc is None else _crc.extend)
    return None if crc is None else out_crc


def frames(mem: np.ndarray, todo: Sequence[gather.Run], crc: int | None = 0,
           view_min_bytes: int = gather.VIEW_MIN_BYTES, engine: str | None = None,
           mac=None) -> tuple[list, int | None]:
    """A payload's buffers to send (views of mem for ranges of view_min_bytes or more, joined
    copies of the others) and crc extended over them in order: hostmem.gather.frames, with
    the joined copies made by this engine; mac, if given, is fed every byte in order."""
    def join(m, piece, c):
        return gather_piece(m, piece, c, engine, mac)

    def view(c, buf):
        if mac is not None:
            mac.update(buf)
        return None if c is None else _crc.extend(c, buf)

    return gather.frames(mem, todo, crc, view, view_min_bytes, join=join)


def _check_bounds(mem: np.ndarray, todo: Sequence[gather.Run]) -> None:
    """ValueError unless every row of todo lies in mem (numpy views would fail less clearly)."""
    lo, hi = gather.span(todo)
    if todo and (lo < 0 or hi > mem.size):
        raise ValueError(f"runs span bytes [{lo}, {hi}) of a buffer of {mem.size}")
