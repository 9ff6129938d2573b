"""Replay: the key index a journal's records leave, with the values that cannot be right set aside.

A record lost to damage could have deleted or replaced its key's value: the journal marks the
spot with a LOST record (Journal.open), and replay sets aside the value its key has there (every
value there when the key is unknown). A later, intact record of the key binds it again.

A journal that lost records to damage can also leave a key on extents that a lost Delete or
Store had freed and a later Store reused. The allocator only hands out free extents, so when two
values overlap, the older one was already gone: it is set aside, never given back as good.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from storage_node import journal as jr

STALE = "its extents hold a newer value (a record that freed them was lost)"
DOUBTFUL = "a later record of its key (or of a key that could not be read) was lost to damage"


@dataclass
class Replayed:
    """The index a replay leaves: key -> its PUT record, and key -> why its value was set aside."""

    entries: dict[bytes, jr.Record] = field(default_factory=dict)
    dropped: dict[bytes, str] = field(default_factory=dict)


def extent_problem(record: jr.Record, capacity_bytes: int, block_bytes: int) -> str:
    """Why a PUT record's extents cannot hold its value in this namespace ("" when they can)."""
    total, last_end = 0, -1
    for ext in sorted(record.extents):
        if ext.length <= 0 or ext.offset % block_bytes or ext.length % block_bytes:
            return f"extent {tuple(ext)} is not whole blocks"
        if ext.end > capacity_bytes:
            return f"extent {tuple(ext)} passes the namespace's end ({capacity_bytes} bytes)"
        if ext.offset < last_end:
            return "its extents overlap"
        total, last_end = total + ext.length, ext.end
    if total < record.value_length:
        return f"{total} bytes of extents for a value of {record.value_length}"
    return ""


def replay(records: Iterable[jr.Record], capacity_bytes: int, block_bytes: int) -> Replayed:
    """Apply records in order (a LOST record sets aside its key's value, or every value when its key
    is empty), then set aside every value whose extents a newer value holds."""
    out = Replayed()
    order: dict[bytes, int] = {}
    for i, record in enumerate(records):
        if record.kind == jr.LOST:
            for key in list(out.entries) if not record.key else [record.key]:
                if out.entries.pop(key, None) is not None:
                    out.dropped[key] = DOUBTFUL
            continue
        out.entries.pop(record.key, None)
        out.dropped.pop(record.key, None)
        if record.kind != jr.PUT:
            continue
        problem = extent_problem(record, capacity_bytes, block_bytes)
        if problem:
            out.dropped[record.key] = problem
        else:
            out.entries[record.key] = record
            order[record.key] = i
    for key in stale_keys(out.entries, order):
        del out.entries[key]
        out.dropped[key] = STALE
    return out


def stale_keys(entries: dict[bytes, jr.Record], order: dict[bytes, int]) -> set[bytes]:
    """Keys whose extents overlap a newer key's (one sweep by offset; no overlap, no cost but a sort)."""
    spans = sorted((e.offset, e.end, order[key], key) for key, r in entries.items() for e in r.extents)
    active: list[tuple[int, int, bytes]] = []  # heap of (end, order, key) still open at the sweep
    stale: set[bytes] = set()
    for offset, end, newer, key in spans:
        while active and active[0][0] <= offset:
            heapq.heappop(active)
        for _, other, other_key in active:
            stale.add(other_key if other < newer else key)
        heapq.heappush(active, (end, newer, key))
    return stale
