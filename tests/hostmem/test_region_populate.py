"""A region mapped up front (Region.populate): every page resident in the creator's mapping and in an
attached one, the bytes unchanged, and asking again harmless."""
from __future__ import annotations

import mmap
import sys
import uuid

import numpy as np
import pytest

from hostmem.region import Region

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")

SIZE = 64 * mmap.PAGESIZE


def resident_pages(region: Region) -> int:
    """Pages of the region resident in memory (mincore)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    vec = (ctypes.c_ubyte * (region.size // mmap.PAGESIZE))()
    address = ctypes.addressof(ctypes.c_char.from_buffer(region._mmap))
    if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(region.size), vec) != 0:
        pytest.skip("mincore is not available")
    return sum(v & 1 for v in vec)


def test_populate_allocates_every_page_and_keeps_the_bytes():
    name = f"kvtb-test-populate-{uuid.uuid4().hex[:8]}"
    region = Region.create(name, SIZE, SIZE - 4096, 1)
    try:
        region.array[:100] = 7
        assert resident_pages(region) < 64  # a fresh region: only what was written is there
        if not region.populate():
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
        assert resident_pages(region) == 64
        assert (region.array[:100] == 7).all() and not region.array[100:].any()
        other = Region.attach(name, SIZE, SIZE - 4096, 1)
        try:
            assert other.populate() and resident_pages(other) == 64
            other.array[200] = 9
            assert region.array[200] == 9  # one memory, both mappings
        finally:
            other.close()
        assert region.populate()  # again: harmless
    finally:
        region.close()
