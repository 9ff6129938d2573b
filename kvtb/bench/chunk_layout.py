"""Where the transfer benchmarks' chunks lie in a region: strided rows, as in a KV pool (pure).

A chunk of KV is gathered from many ranges, one [layer, K|V, kv_head] row of its tokens each.
The benchmarks lay `count` chunks of `chunk_bytes` out so: row k of chunk i at
base + (k * count + i) * row, with RANGES_PER_CHUNK rows per chunk. `kvtb bench smartnic`'s
transfers and the bare path (`kvtb.bench.barepath`) both use it, so they move the same bytes.
"""
from __future__ import annotations

RANGES_PER_CHUNK = 128


def strided_ranges(base: int, index: int, count: int, chunk_bytes: int,
                   ranges_per_chunk: int = RANGES_PER_CHUNK) -> tuple[tuple[int, int], ...]:
    """The (offset, length) ranges of chunk `index` of `count`.

    ValueError unless the chunk splits into ranges_per_chunk rows of whole bytes."""
    row, rest = divmod(chunk_bytes, ranges_per_chunk)
    if row == 0 or rest:
        raise ValueError(f"a chunk of {chunk_bytes} bytes does not split into {ranges_per_chunk} equal rows")
    return tuple((base + (k * count + index) * row, row) for k in range(ranges_per_chunk))
