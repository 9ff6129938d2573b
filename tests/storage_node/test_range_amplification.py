"""One range read cannot make the node do unbounded work (a real node on loopback): 4,096 one-byte ranges
spread over a 200 MiB value are refused at once with "invalid field" (they took 74-111 s, each checking
the whole value), the same ranges side by side are one range once merged and served quickly, and a
legitimate multi-range read of several values still works."""
from __future__ import annotations

import time

import numpy as np
import pytest

from fabric import status as st
from fabric.client import StorageStatusError
from storage_node.node import StorageNode
from tests.conftest import fabric_client

from .conftest import GOOD_HOST, settings_for

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

VALUE_BYTES = 200 << 20


@pytest.fixture
def client(tmp_path):
    node = StorageNode(settings_for(tmp_path, metrics_address="127.0.0.1:0", namespace_size_bytes=512 << 20))
    node.start()
    c = fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=30)
    c.connect()
    yield c
    c.close()
    node.stop()


def test_spread_ranges_are_refused_fast_and_adjacent_ones_are_merged(client):
    value = np.random.default_rng(7).integers(0, 256, VALUE_BYTES, dtype=np.uint8)
    client.store(1, b"big", [value])

    spread = [(b"big", i * (VALUE_BYTES // 4096), 1) for i in range(4096)]
    start = time.monotonic()
    with pytest.raises(StorageStatusError) as err:
        client.retrieve_ranges(1, spread)
    assert err.value.status == st.INVALID_FIELD and "merged" in err.value.message
    assert time.monotonic() - start < 1.0

    adjacent = [(b"big", 1000 + i, 1) for i in range(4096)]
    start = time.monotonic()
    done = client.retrieve_ranges(1, adjacent)
    assert time.monotonic() - start < 5.0  # one check of the value, not 4,096
    assert list(done.response.range_status) == [0] * 4096
    assert b"".join(bytes(f.buffer) for f in done.frames) == value[1000:1000 + 4096].tobytes()


def test_a_legitimate_multi_range_read_still_works(client):
    values = {b"k%d" % i: bytes([i]) * (100_000 + i) for i in range(8)}
    for key, v in values.items():
        client.store(1, key, [v])
    asked = [(key, 10 * i, 1000 + i) for i, key in enumerate(values)] + [(b"k0", 50_000, 7)]
    done = client.retrieve_ranges(1, asked)
    assert list(done.response.range_status) == [0] * len(asked)
    assert [bytes(f.buffer) for f in done.frames] == [values[k][o:o + n] for k, o, n in asked]
