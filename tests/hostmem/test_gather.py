"""Scatter-gather plans and copies (pure: numpy only)."""
from __future__ import annotations

import numpy as np
import pytest

from kvtb.crc32c import crc32c, extend
from hostmem import gather
from hostmem.gather import Run

MEM = np.random.default_rng(7).integers(0, 256, 4 << 20, dtype=np.uint8)  # [4 MiB] uint8


def concat(mem: np.ndarray, ranges) -> bytes:
    return b"".join(mem[o:o + n].tobytes() for o, n in ranges)


def strided(first: int, length: int, stride: int, count: int) -> list[tuple[int, int]]:
    return [(first + i * stride, length) for i in range(count)]


def test_coalesce_merges_touching_ranges_and_drops_empty_ones():
    assert gather.coalesce([(0, 4), (4, 4), (8, 0), (8, 2), (20, 1)]) == [(0, 10), (20, 1)]


def test_coalesce_refuses_a_negative_length():
    with pytest.raises(ValueError, match="negative"):
        gather.coalesce([(0, 4), (10, -1)])


def test_runs_finds_one_length_at_one_stride():
    ranges = [(100, 8)] + strided(1000, 16, 64, 5) + [(5000, 16)]
    assert gather.runs(ranges) == [Run(100, 8, 8, 1), Run(1000, 16, 64, 5), Run(5000, 16, 16, 1)]


def test_runs_never_overlap_and_keep_order():
    # stride shorter than the length, and a descending offset, both start new runs
    assert gather.runs([(0, 16), (8, 16), (4, 16)]) == [Run(0, 16, 16, 1), Run(8, 16, 16, 1),
                                                        Run(4, 16, 16, 1)]


def test_span_covers_every_byte():
    todo = gather.runs_of([(64, 4)] + strided(1000, 16, 100, 3))
    assert gather.span(todo) == (64, 1216)
    assert gather.span([]) == (0, 0)


def test_plan_sends_large_ranges_as_views_and_joins_the_small_ones_between():
    todo = gather.runs_of([(0, 10), (100, 10)] + strided(1000, 64, 100, 3) + [(2000, 5)])
    pieces = gather.plan(todo, view_min_bytes=64)
    assert [p.view for p in pieces] == [False, True, True, True, False]
    assert [p.nbytes for p in pieces] == [20, 64, 64, 64, 5]


@pytest.mark.parametrize("length", [8, 1000, 8192, gather.BLOCK_BYTES + 3])
def test_frames_hold_the_ranges_in_order_with_their_crc(length):
    ranges = [(7, 13)] + strided(4096, length, length + 11, 3)
    bufs, crc = gather.frames(MEM, gather.runs_of(ranges), crc32c(b"head"), extend, view_min_bytes=4096)
    assert b"".join(bytes(memoryview(b)) for b in bufs) == concat(MEM, ranges)
    assert crc == crc32c(b"head" + concat(MEM, ranges))


def test_large_ranges_go_out_as_views_without_a_copy():
    bufs, _ = gather.frames(MEM, gather.runs_of(strided(0, 4096, 8192, 2)), view_min_bytes=4096)
    assert len(bufs) == 2 and all(np.shares_memory(b, MEM) for b in bufs)
    joined, _ = gather.frames(MEM, gather.runs_of(strided(0, 100, 200, 2)), view_min_bytes=4096)
    assert len(joined) == 1 and not np.shares_memory(joined[0], MEM)


@pytest.mark.parametrize("length", [8, 8192, gather.BLOCK_BYTES + 3])
def test_scatter_is_the_inverse_of_gather_and_checksums_the_source(length):
    ranges = [(3, 5)] + strided(4096, length, length + 100, 4)
    source = concat(MEM, ranges)
    dst = np.zeros_like(MEM)
    nbytes, crc = gather.scatter(source, dst, gather.runs_of(ranges), 0, extend)
    assert nbytes == len(source) and crc == crc32c(source)
    assert concat(dst, ranges) == source
    touched = np.zeros(MEM.size, bool)
    for o, n in ranges:
        touched[o:o + n] = True
    assert not dst[~touched].any()  # nothing outside the ranges was written


def test_scatter_refuses_a_source_of_another_size_and_writes_nothing():
    dst = np.zeros(1024, np.uint8)
    with pytest.raises(ValueError, match="source of 9 bytes"):
        gather.scatter(b"x" * 9, dst, gather.runs_of([(0, 4), (10, 4)]))
    assert not dst.any()


def test_cut_names_the_rows_that_hold_a_slice_of_the_stream():
    todo = [Run(0, 10, 100, 3), Run(1000, 4, 4, 1)]  # rows of 10 at 0, 100, 200; then 4 at 1000
    assert gather.cut(todo, 0, 34) == todo
    assert gather.cut(todo, 5, 20) == [Run(5, 5, 5, 1), Run(100, 10, 100, 1), Run(200, 5, 5, 1)]
    assert gather.cut(todo, 12, 3) == [Run(102, 3, 3, 1)]
    assert gather.cut(todo, 28, 6) == [Run(208, 2, 2, 1), Run(1000, 4, 4, 1)]
    assert gather.cut(todo, 34, 0) == []


@pytest.mark.parametrize("seed", range(20))
def test_scattering_a_stream_in_pieces_at_their_offsets_equals_scattering_it_whole(seed):
    rng = np.random.default_rng(seed)
    ranges, offset = [], 0
    for _ in range(int(rng.integers(1, 6))):
        length, count = int(rng.integers(1, 50)), int(rng.integers(1, 5))
        stride = length + int(rng.integers(0, 20))
        ranges += strided(offset, length, stride, count)
        offset += count * stride + int(rng.integers(0, 30))
    todo = gather.runs_of(ranges)
    source = concat(MEM, ranges)
    whole, pieces = np.zeros(offset, np.uint8), np.zeros(offset, np.uint8)
    gather.scatter(source, whole, todo)
    pos, crc = 0, 0
    while pos < len(source):
        n = int(rng.integers(1, len(source) - pos + 1))
        _, crc = gather.scatter(source[pos:pos + n], pieces, gather.cut(todo, pos, n), crc, extend)
        pos += n
    assert np.array_equal(whole, pieces) and crc == crc32c(source)
