"""The data path's copy engine: scatter-gather copies between a region and contiguous buffers, with
the crc32c folded in.

Two engines do the same copies and give the same crc32c:
- "compiled" (hostmem/_dma.c, built by `pip install` when a C compiler is there): copies each
  row in pieces and checksums each piece from L1 at once, with the GIL released;
- "numpy" (hostmem.gather with kvtb.crc32c): copies blocks of 512 KiB, then checksums each.

The compiled one is used when it was built and the CPU has SSE4.2; KVTB_DMA=numpy picks numpy
(to compare the two, or to rule the compiled one out). ENGINE says which one runs.
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

ENGINES = ("compiled", "numpy")


def _choose(wanted: str | None) -> str:
    if wanted not in (None, "", *ENGINES):
        raise ValueError(f"KVTB_DMA={wanted!r}: expected one of {', '.join(ENGINES)}")
    available = _dma is not None and _dma.HARDWARE_CRC
    if wanted == "compiled" and not available:
        raise ValueError("KVTB_DMA=compiled, but hostmem._dma was not built or this CPU has no SSE4.2")
    return wanted or ("compiled" if available else "numpy")


ENGINE = _choose(os.environ.get("KVTB_DMA"))


def scatter(source, mem: np.ndarray, todo: Sequence[gather.Run], crc: int = 0,
            engine: str | None = None) -> tuple[int, int]:
    """Copy a contiguous source into the runs of mem, in order; (bytes copied, crc extended over
    the source). ValueError, with nothing copied, when the source does not hold exactly the runs'
    bytes or a run lies outside mem."""
    if (engine or ENGINE) == "compiled":
        crc = _dma.scatter(source, mem, todo, crc)
        return memoryview(source).nbytes, crc
    _check_bounds(mem, todo)
    return gather.scatter(source, mem, todo, crc, _crc.extend)


def gather_piece(mem: np.ndarray, piece: gather.Piece, crc: int = 0,
                 engine: str | None = None) -> tuple[np.ndarray, int]:
    """(one new buffer with the piece's ranges back to back, crc extended over it)."""
    if (engine or ENGINE) == "compiled":
        out = np.empty(piece.nbytes, dtype=np.uint8)
        return out, _dma.gather(mem, piece.runs, out, crc)
    _check_bounds(mem, piece.runs)
    return gather.gather(mem, piece, crc, _crc.extend)


def frames(mem: np.ndarray, todo: Sequence[gather.Run], crc: int = 0,
           view_min_bytes: int = gather.VIEW_MIN_BYTES, engine: str | None = None) -> tuple[list, int]:
    """A payload's buffers to send (views of mem for ranges of view_min_bytes or more, joined
    copies of the others) and crc extended over them in order: hostmem.gather.frames, with
    the joined copies made by this engine."""
    return gather.frames(mem, todo, crc, _crc.extend, view_min_bytes,
                         join=lambda m, piece, c: gather_piece(m, piece, c, engine))


def _check_bounds(mem: np.ndarray, todo: Sequence[gather.Run]) -> None:
    """ValueError unless every row of todo lies in mem (numpy views would fail less clearly)."""
    lo, hi = gather.span(todo)
    if todo and (lo < 0 or hi > mem.size):
        raise ValueError(f"runs span bytes [{lo}, {hi}) of a buffer of {mem.size}")
