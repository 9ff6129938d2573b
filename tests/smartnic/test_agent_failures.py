"""Corruption, eviction, several storage nodes and an idle watcher, with real processes."""
from __future__ import annotations

import time

import pytest

from kvtb.launch import free_port
from kvtb_proto import smartnic_pb2
from fabric import chunk_format as cf
from fabric.client import FabricClient
from tests.conftest import TEST_HOST, fabric_client
from tests.smartnic.conftest import compute_beside
from tests.smartnic.helpers import LAYOUT, agent_env, storage_env
from tests.smartnic.test_agent_service import CTX, IDS, USER, turn


def start(start_service, tmp_path, nodes=("s0",), **agent_settings):
    storage = [(n, start_service(f"storage-{n}", "serve", "storage", env=storage_env(tmp_path, n))) for n in nodes]
    agent = start_service("agent", "serve", "smartnic", env=agent_env(storage, **agent_settings))
    return storage, agent


def fabric(proc, host_nqn: str = TEST_HOST) -> FabricClient:
    """A connected, authenticated client of the node (as the tests' own host, unless told)."""
    client = fabric_client(proc.addresses["fabric"], host_nqn)
    client.connect()
    return client


def stats(pool):
    return pool.stub.Stats(smartnic_pb2.StatsRequest())


def test_a_corrupt_block_is_an_error_is_dropped_and_deleted(compute, storage):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    blocks = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX)).chunks
    client = fabric(storage[0][1])
    value = bytearray(client.retrieve(1, blocks[1].key).payload())
    value[-1 - cf.MAC_BYTES] ^= 0xFF  # one flipped byte of KV, stored with a matching crc: only the agent can tell
    client.store(1, blocks[1].key, [bytes(value)])
    turn(channel, IDS + [7])
    assert [e > 0 for _, e in fake.outcomes[-1]] == [False, True, False, False]
    left = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX)).chunks
    assert [c.chunk_index for c in left] == [0]  # the context's usable prefix ends at the gap
    turn(channel, IDS + [7])
    assert fake.requests[-1].stored_tokens == 16
    assert stats(pool).errors_by_kind["mac_mismatch"] == 1
    deadline = time.monotonic() + 5
    while blocks[1].key in client.list_keys(1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert blocks[1].key not in client.list_keys(1)  # the corrupt block was deleted on the node
    client.close()


@pytest.mark.slow
def test_idle_blocks_are_evicted_and_deleted_on_storage(start_service, tmp_path):
    storage, agent = start(start_service, tmp_path, eviction_policy="timer", ttl_s=1.0, eviction_interval_s=0.2)
    with compute_beside(agent.addresses["grpc"]) as (pool, _, _):
        pool.offload(IDS, USER, CTX)
        client = fabric(storage[0][1])
        assert len(client.list_keys(1)) == 4
        deadline = time.monotonic() + 5
        while stats(pool).chunks and time.monotonic() < deadline:
            time.sleep(0.1)
        s = stats(pool)
        assert s.chunks == 0 and s.contexts == 0 and dict(s.evictions_by_reason) == {"ttl": 4}
        time.sleep(0.3)
        assert client.list_keys(1) == []
        client.close()


def test_blocks_spread_over_two_nodes_and_lru_capacity(start_service, tmp_path):
    block_bytes = LAYOUT.chunk_payload_bytes(16) + 400
    _, agent = start(start_service, tmp_path, nodes=("s0", "s1"), eviction_policy="lru",
                     capacity_high_bytes=11 * block_bytes, capacity_low_bytes=8 * block_bytes,
                     eviction_interval_s=0.1)
    with compute_beside(agent.addresses["grpc"]) as (pool, fake, channel):
        ids = {c: [hash(c) % 1000 + i for i in range(64)] for c in ("c-a", "c-b", "c-c")}
        pool.offload(ids["c-a"], USER, "c-a")
        pool.offload(ids["c-b"], USER, "c-b")
        s = stats(pool)
        assert set(s.bytes_by_storage_node) == {"s0", "s1"} and s.chunks == 8
        turn(channel, ids["c-a"] + [7], context="c-a")  # c-a's blocks are now the most recently used
        # past 11 blocks (only the 12th crosses it, so one pass whenever it runs): evict down to 8,
        # least recently used first: c-b's 4
        pool.offload(ids["c-c"], USER, "c-c")
        deadline = time.monotonic() + 5
        while stats(pool).chunks > 9 and time.monotonic() < deadline:
            time.sleep(0.05)
        contexts = pool.stub.ListContexts(smartnic_pb2.ListContextsRequest(user_id=USER)).contexts
        assert sorted(c.context_id for c in contexts) == ["c-a", "c-c"]
        s = stats(pool)
        assert dict(s.evictions_by_reason) == {"capacity": 12 - s.chunks} and s.chunks in (8, 9)


def test_the_watcher_does_not_burn_a_core_while_waiting(start_service, tmp_path):
    _, agent = start(start_service, tmp_path)
    with compute_beside(agent.addresses["grpc"]) as (pool, _, _):  # a pool's standing PUTs are armed
        time.sleep(0.2)
        before = agent.cpu_seconds()
        time.sleep(1.0)
        assert agent.cpu_seconds() - before < 0.25  # a spinning watcher would use ~1 s
        pool.offload(IDS, USER, CTX)  # and it still fires


@pytest.mark.slow
def test_a_node_down_at_start_is_tolerated_and_joins_later(start_service, tmp_path):
    s0 = start_service("storage-s0", "serve", "storage", env=storage_env(tmp_path, "s0"))
    port = free_port()
    late = {"admin": "127.0.0.1:0", "fabric": f"tcp://127.0.0.1:{port}"}
    agent = start_service("agent", "serve", "smartnic", env=agent_env([("s0", s0), ("s1", late)]))
    assert agent.ready["storage_nodes_up"] == ["s0"]
    with compute_beside(agent.addresses["grpc"]) as (pool, _, _):
        pool.offload(IDS, USER, "c-early")
        assert set(stats(pool).bytes_by_storage_node) == {"s0"}
        start_service("storage-s1", "serve", "storage",
                      env={**storage_env(tmp_path, "s1"), "KVTB_STORAGE_FABRIC_ADDRESS": late["fabric"]})
        deadline, n = time.monotonic() + 10, 0
        while time.monotonic() < deadline and "s1" not in stats(pool).bytes_by_storage_node:
            pool.offload([5000 + n * 100 + i for i in range(64)], USER, f"c-{n}")
            n += 1
            time.sleep(0.2)
        assert "s1" in stats(pool).bytes_by_storage_node
