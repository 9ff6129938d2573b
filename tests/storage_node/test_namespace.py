"""Buffer <-> extent I/O of file-backed namespaces, and the crc folded into a write."""
from __future__ import annotations

import os

import numpy as np
import pytest

from kvtb.crc32c import crc32c
from storage_node import namespace
from storage_node.allocator import Extent

DATA = np.random.default_rng(5).integers(0, 256, 3 * namespace.CHECK_BLOCK_BYTES + 77, dtype=np.uint8)


@pytest.mark.parametrize("with_crc", [False, True])
def test_buffers_scatter_over_extents_in_order(tmp_path, with_crc):
    cuts = [0, 10, 4096, namespace.CHECK_BLOCK_BYTES + 5, DATA.size]
    buffers = [DATA[a:b] for a, b in zip(cuts, cuts[1:])]  # odd sizes, across block bounds
    extents = [Extent(8192, 4096), Extent(0, 8192), Extent(1 << 21, DATA.size - 12288)]
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        got = namespace.write_extents(fd, buffers, extents, 0 if with_crc else None)
        out = np.empty_like(DATA)
        namespace.read_extents(fd, extents, memoryview(out))
    finally:
        os.close(fd)
    assert bytes(out) == bytes(DATA)
    assert got == (crc32c(DATA) if with_crc else None)


def test_writeback_starts_every_few_mib_as_a_value_is_written_and_at_each_extent_end(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(namespace, "start_writeback", lambda fd, extents: started.extend(extents))
    mib = 1 << 20
    value = np.random.default_rng(6).integers(0, 256, 11 * mib, dtype=np.uint8)
    extents = [Extent(0, 10 * mib), Extent(64 * mib, mib)]
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        assert namespace.write_extents(fd, [value], extents, 0, writeback=True) == crc32c(value)
        out = np.empty_like(value)
        namespace.read_extents(fd, extents, memoryview(out))
    finally:
        os.close(fd)
    assert bytes(out) == bytes(value)
    assert namespace.WRITEBACK_BYTES == 4 * mib
    assert started == [Extent(0, 4 * mib), Extent(4 * mib, 4 * mib), Extent(8 * mib, 2 * mib),
                       Extent(64 * mib, mib)]


def test_a_value_under_the_step_is_handed_over_once_and_nothing_without_writeback(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(namespace, "start_writeback", lambda fd, extents: started.extend(extents))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        namespace.write_extents(fd, [DATA], [Extent(1 << 20, DATA.size)], 0, writeback=True)
        namespace.write_extents(fd, [DATA], [Extent(8 << 20, DATA.size)], 0)
    finally:
        os.close(fd)
    assert started == [Extent(1 << 20, DATA.size)]
