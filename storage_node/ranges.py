"""A range read's ranges, grouped by key and merged (pure): what bounds its work.

A range read (KV_RETRIEVE_RANGES) is answered range by range, as asked; the node reads each
key once, over the bytes that cover all of that key's ranges. Its caps count ranges once
adjacent or overlapping ranges of one key are merged: asking for a value in 4,096 adjacent
pieces costs what asking for it whole does.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence


def by_key(ranges: Iterable) -> dict[bytes, list[int]]:
    """key -> indexes of its ranges (ValueRange-like: key, offset, length), in the order asked."""
    groups: dict[bytes, list[int]] = {}
    for i, r in enumerate(ranges):
        groups.setdefault(r.key, []).append(i)
    return groups


def merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) spans merged where they touch or overlap: sorted [start, end) pairs."""
    out: list[list[int]] = []
    for offset, length in sorted(spans):
        end = offset + length
        if out and offset <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([offset, end])
    return [(lo, hi) for lo, hi in out]


def merged_count(ranges: Sequence) -> int:
    """How many ranges are left once adjacent or overlapping ranges of one key are merged."""
    return sum(len(merged((ranges[i].offset, ranges[i].length) for i in idx)) for idx in by_key(ranges).values())


def covering(ranges: Sequence) -> dict[bytes, tuple[int, int]]:
    """key -> the [start, end) that covers all its ranges."""
    out: dict[bytes, tuple[int, int]] = {}
    for r in ranges:
        lo, hi = out.get(r.key, (r.offset, r.offset + r.length))
        out[r.key] = (min(lo, r.offset), max(hi, r.offset + r.length))
    return out
