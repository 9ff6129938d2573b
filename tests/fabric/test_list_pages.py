"""FabricClient.list_keys asks a node for at most 1,000 keys a command (a node refuses a List over its
max_list_keys), paging from the last key until it has max_keys or the keys end; and a payload buffer
larger than a frame goes as views of at most fabric.frames.FRAME_BYTES (a node drops larger frames)."""
from __future__ import annotations

import numpy as np
import pytest

from fabric import frames
from fabric.client import LIST_PAGE_KEYS
from storage_node.node import StorageNode
from tests.conftest import fabric_client
from tests.storage_node.conftest import GOOD_HOST, settings_for

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_split_cuts_large_buffers_into_views():
    big = np.arange(10 * 1024, dtype=np.uint32)  # 40 KiB, not bytes
    out = frames.split([b"small", big, memoryview(b"x" * 100)], 16 << 10)
    assert [memoryview(f).nbytes for f in out] == [5, 16 << 10, 16 << 10, 8 << 10, 100]
    assert b"".join(bytes(f) for f in out[1:4]) == big.tobytes()
    assert out[1].obj is not None  # a view, not a copy
    with pytest.raises(ValueError):
        frames.split([np.zeros((64, 64), np.uint8)[:, ::2]], 16)  # not contiguous: cannot be cut


def test_list_keys_pages_and_a_node_takes_frames_of_its_size(tmp_path):
    node = StorageNode(settings_for(tmp_path, metrics_address="127.0.0.1:0", fsync=False,
                                    max_list_keys=LIST_PAGE_KEYS, max_frame_bytes=frames.FRAME_BYTES))
    node.start()
    try:
        with fabric_client(node.addresses["fabric"], GOOD_HOST) as client:
            keys = [b"key-%05d" % i for i in range(2 * LIST_PAGE_KEYS + 5)]
            for key in keys:
                client.store(1, key, [b"v"])
            assert client.list_keys(1, max_keys=100_000) == keys
            assert client.list_keys(1, start_key=keys[10], max_keys=1500) == keys[11:1511]
            value = np.random.default_rng(1).integers(0, 256, 3 * frames.FRAME_BYTES + 7, dtype=np.uint8)
            client.store(1, b"large", [value])  # one buffer of 12 MiB: sent as 4 frames
            assert bytes(client.retrieve(1, b"large").payload()) == value.tobytes()
    finally:
        node.stop()
