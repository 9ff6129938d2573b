"""The transfer benchmarks' layout: every chunk's rows, together, tile the area once."""
import pytest

from kvtb.bench.chunk_layout import strided_ranges


def test_the_chunks_rows_tile_the_area_exactly_once():
    count, chunk, rows, base = 4, 64, 8, 1000
    covered = sorted(r for i in range(count) for r in strided_ranges(base, i, count, chunk, rows))
    assert covered == [(base + j * (chunk // rows), chunk // rows) for j in range(count * rows)]
    assert strided_ranges(base, 1, count, chunk, rows)[:2] == ((base + 8, 8), (base + 40, 8))


def test_a_chunk_must_split_into_whole_rows():
    with pytest.raises(ValueError, match="equal rows"):
        strided_ranges(0, 0, 2, 65, 8)
