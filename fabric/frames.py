"""The fabric's frame size: what a storage node takes in one ZeroMQ frame, and splitting to fit.

A storage node caps each frame it receives (ZeroMQ's ZMQ_MAXMSGSIZE, the node's
`max_frame_bytes`): libzmq drops the connection of a peer that announces a larger frame before
it buffers a byte of it. So a host never sends a frame over FRAME_BYTES: `split` cuts larger
payload buffers into views (no copy). A value is the concatenation of its frames, so the cut
changes nothing the node stores.
"""
from __future__ import annotations

from collections.abc import Iterable

FRAME_BYTES = 4 << 20          # the largest frame a host sends (payload buffers are cut to it)
MAX_HEADER_BYTES = 256 << 10   # the largest capsule (header frame) a node takes: 4,096 ranges fit


def split(frames: Iterable, max_bytes: int = FRAME_BYTES) -> list:
    """frames with each buffer over max_bytes cut into views of at most max_bytes (no copy)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes {max_bytes} must be positive")
    out = []
    for frame in frames:
        view = memoryview(frame)
        if view.nbytes <= max_bytes:
            out.append(frame)
            continue
        if not view.c_contiguous:
            raise ValueError("a payload buffer over the frame size must be contiguous to be cut")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        out += [view[o:o + max_bytes] for o in range(0, view.nbytes, max_bytes)]
    return out
