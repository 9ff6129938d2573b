"""The CPU-centric offload: in_flight=1 waits for each block's ack before store() returns (the baseline);
in_flight=K keeps up to K Stores out and drain() waits for the rest; a block is indexed only once its
Store succeeded, and a failed Store is counted, never acknowledged silently. A real storage node
in-process (authenticated, as the compute node connects), and a fake fabric client where the order of
completions must be chosen."""
from __future__ import annotations

import concurrent.futures
import time
import uuid

import numpy as np
import pytest

from compute_node.cpu_offload import CpuOffload, CpuStore
from compute_node.kv_pool import KvPool
from compute_node.offload import Block, OffloadStats
from compute_node.restore import BlockRestore, PendingRestore
from fabric.client import Completion
from hostmem.block_hash import hash_chain, salt_for
from hostmem.kv_layout import KvLayout
from kvtb_proto import nvmeof_pb2
from storage_node.node import StorageNode
from tests.conftest import fabric_security
from tests.storage_node.conftest import GOOD_HOST, settings_for

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

L = KvLayout(num_blocks=12, num_layers=2, num_kv_heads=1, block_tokens=4, head_dim=8)
MAC_KEY = b"k" * 32
SALT = "test-cpu-offload-salt"


@pytest.fixture
def pool():
    p = KvPool.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", L)
    rng = np.random.default_rng(3)
    kv_bytes = L.num_blocks * L.block_bytes
    p.region.view(0, kv_bytes)[:] = rng.integers(0, 256, kv_bytes, dtype=np.uint8).tobytes()
    ids = np.arange(L.num_blocks * L.block_tokens) % 1000
    p.token_ids[:] = ids.reshape(L.num_blocks, L.block_tokens)
    yield p
    p.close()


@pytest.fixture
def node(tmp_path):
    n = StorageNode(settings_for(tmp_path, metrics_address="127.0.0.1:0", fsync=False))
    n.start()
    yield n
    n.stop()


def cpu_store(node, nsid: int = 1) -> CpuStore:
    return CpuStore((node.addresses["fabric"],), GOOD_HOST, nsid, SALT, timeout_s=10.0,
                    security=fabric_security(GOOD_HOST), mac_key=MAC_KEY)


def blocks(pool: KvPool, count: int) -> list[Block]:
    """The first `count` pool blocks as one sequence's blocks 0..count-1."""
    ids = pool.token_ids[:count].reshape(-1).tolist()
    names = hash_chain(ids, salt_for("default", "alice"), L.block_tokens)
    return [Block(b, b, L.block_tokens, names[b], names[b - 1] if b else b"", "default", "alice", "c1")
            for b in range(count)]


def restore_into(store: CpuStore, pool: KvPool, block: Block, target: int) -> bytes:
    """Retrieve the stored block into pool block `target` (as a follow-up's restore does); its KV bytes."""
    pool.region.view(*L.block_range(target))[:] = bytes(L.block_bytes)
    counter = L.get_done(target, 0)
    wanted = BlockRestore(block.index, target, block.hash, block.token_count, (counter,), ((0, 0),))
    store.restore(pool, None, PendingRestore([wanted], 0, block.token_count, 0, time.monotonic() + 10))
    assert pool.read_counter(counter) == (1, 0)  # landed and checked (MAC, generation)
    return bytes(pool.region.view(*L.block_range(target)))


def test_in_flight_1_acknowledges_each_block_before_store_returns(pool, node):
    store = cpu_store(node)
    offload, stats = CpuOffload(pool, store), OffloadStats()
    try:
        for i, block in enumerate(blocks(pool, 3)):
            offload.store(block, stats)
            assert offload.outstanding == 0 and block.hash in store.index  # stored and acknowledged
            assert stats.chunks == i + 1
        assert offload.errors == 0 and offload.drain() == 0
        first = blocks(pool, 1)[0]
        assert restore_into(store, pool, first, 11) == bytes(pool.region.view(*L.block_range(0)))
    finally:
        store.close()


def test_in_flight_k_keeps_at_most_k_out_and_drain_stores_every_block(pool, node):
    store = cpu_store(node)
    offload, stats = CpuOffload(pool, store, in_flight=3), OffloadStats()
    seq = blocks(pool, 8)
    try:
        for block in seq:
            offload.store(block, stats)
            assert offload.outstanding <= 2  # with the next block's, at most 3 Stores are out
        offload.drain()
        assert offload.outstanding == 0 and offload.errors == 0
        assert stats.chunks == 8 and all(b.hash in store.index for b in seq)
        assert stats.bytes == sum(s.length for s in store.index.values())
        assert restore_into(store, pool, seq[5], 11) == bytes(pool.region.view(*L.block_range(5)))
    finally:
        store.close()


@pytest.mark.parametrize("in_flight", [1, 4])
def test_a_refused_store_is_counted_and_never_indexed(pool, node, in_flight):
    store = cpu_store(node, nsid=99)  # no such namespace: the node answers every Store with an error
    offload, stats = CpuOffload(pool, store, in_flight=in_flight), OffloadStats()
    try:
        for block in blocks(pool, 3):
            offload.store(block, stats)
        offload.drain()
        assert offload.errors == 3 and offload.last_error and store.index == {}
        assert stats.chunks == 0 and stats.bytes == 0
    finally:
        store.close()


class FakeClient:
    """A fabric client whose Stores complete when the test says."""

    timeout_s = 5.0

    def __init__(self):
        self.futures: list[concurrent.futures.Future] = []

    def submit(self, capsule, frames=()):
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.futures.append(future)
        return future

    def close(self):
        pass


def completion(status_code: int = 0) -> Completion:
    return Completion(nvmeof_pb2.ResponseCapsule(status_code_type=1 if status_code else 0,
                                                 status_code=status_code))


def test_a_block_is_indexed_only_once_its_completion_succeeded(pool):
    store = CpuStore(("fake",), GOOD_HOST, 1, SALT, mac_key=MAC_KEY)
    fake = store._clients["fake"] = FakeClient()
    offload, stats = CpuOffload(pool, store, in_flight=2), OffloadStats()
    b0, b1, b2 = blocks(pool, 3)
    offload.store(b0, stats)
    assert offload.outstanding == 1 and b0.hash not in store.index and stats.chunks == 0  # sent, not acked
    fake.futures[0].set_result(completion(0x2))  # the node refused it
    offload.store(b1, stats)  # two out: the oldest is finished first
    assert offload.errors == 1 and b0.hash not in store.index
    assert offload.outstanding == 1 and b1.hash not in store.index
    fake.futures[1].set_result(completion())
    offload.store(b2, stats)  # a completion already in is taken without waiting
    assert b1.hash in store.index and offload.outstanding == 1
    fake.futures[2].set_exception(TimeoutError("no answer"))
    assert offload.drain() == 1
    assert offload.errors == 2 and "no answer" in offload.last_error and b2.hash not in store.index
    assert stats.chunks == 1 and list(store.index) == [b1.hash]


def test_in_flight_must_be_positive(pool):
    with pytest.raises(ValueError):
        CpuOffload(pool, CpuStore(("fake",), GOOD_HOST, 1, SALT), in_flight=0)
