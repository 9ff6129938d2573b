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
