"""Corruption, eviction, several storage nodes and an idle watcher, with real processes."""
from __future__ import annotations

import os
import time

import pytest

from kvtb.launch import free_port
from kvtb_proto import smartnic_pb2, smartnic_pb2_grpc
from fabric import chunk_format as cf
from fabric.client import FabricClient
from tests.smartnic.helpers import KEY, LAYOUT, Pool, agent_env, storage_env
from tests.smartnic.test_agent_service import CTX, IDS, USER, offload, restore
from tests.conftest import TEST_HOST, fabric_client, secure_channel


def start(start_service, tmp_path, nodes=("s0",), **agent_settings):
    storage = [
        (n, start_service(f"storage-{n}", "serve", "storage", env=storage_env(tmp_path, n))) for n in nodes
    ]
    agent = start_service("agent", "serve", "smartnic", env=agent_env(storage, **agent_settings))
    channel = secure_channel(agent.addresses["grpc"], peer="smartnic")
    return storage, agent, Pool(smartnic_pb2_grpc.SmartNicStub(channel))


def fabric(proc, host_nqn: str = TEST_HOST) -> FabricClient:
    """A connected, authenticated client of the node (as the tests' own host, unless told)."""
    client = fabric_client(proc.addresses["fabric"], host_nqn)
    client.connect()
    return client


def test_corrupt_chunk_is_an_error_and_is_dropped(start_service, tmp_path):
    storage, _, pool = start(start_service, tmp_path)
    try:
        offload(pool)
        chunks = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX)).chunks
        client = fabric(storage[0][1])
        value = bytearray(client.retrieve(1, chunks[1].key).payload())
        value[-1 - cf.MAC_BYTES] ^= 0xFF  # one flipped byte of KV, stored with a matching crc: only the agent can tell
        client.store(1, chunks[1].key, [bytes(value)])
        info = restore(pool, 1, IDS)
        success, error = pool.wait_counter(info.completion_counter, info.threshold)
        assert (success, error - info.error_base) == (3, 1)
        errors = pool.stub.ReadErrors(
            smartnic_pb2.ReadErrorsRequest(region_id=pool.region_id, access_key=KEY)
        )
        assert [(e.kind, e.chunk.chunk_index) for e in errors.errors] == [("mac_mismatch", 1)]
        left = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX)).chunks
        assert [c.chunk_index for c in left] == [0, 2, 3]
        assert restore(pool, 1, IDS).tokens_announced == 16  # the prefix stops at the gap
        stats = pool.stub.Stats(smartnic_pb2.StatsRequest())
        assert stats.errors_by_kind["mac_mismatch"] == 1
        deadline = time.monotonic() + 5
        while chunks[1].key in client.list_keys(1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chunks[1].key not in client.list_keys(1)  # the corrupt chunk was deleted on the node
        client.close()
    finally:
        pool.close()


@pytest.mark.slow
def test_idle_contexts_are_evicted_and_deleted_on_storage(start_service, tmp_path):
    storage, _, pool = start(
        start_service, tmp_path, eviction_policy="timer", ttl_s=1.0, eviction_interval_s=0.2
    )
    try:
        offload(pool)
        client = fabric(storage[0][1])
        assert len(client.list_keys(1)) == 4
        deadline = time.monotonic() + 5
        while pool.stub.Stats(smartnic_pb2.StatsRequest()).contexts and time.monotonic() < deadline:
            time.sleep(0.1)
        stats = pool.stub.Stats(smartnic_pb2.StatsRequest())
        assert stats.contexts == 0 and dict(stats.evictions_by_reason) == {"ttl": 1}
        time.sleep(0.3)
        assert client.list_keys(1) == []
        client.close()
    finally:
        pool.close()


def test_chunks_spread_over_two_nodes_and_lru_capacity(start_service, tmp_path):
    chunk_bytes = 16 * LAYOUT.kv_bytes_per_token + 16 * 4 + 200
    _, _, pool = start(
        start_service,
        tmp_path,
        nodes=("s0", "s1"),
        eviction_policy="lru",
        capacity_high_bytes=10 * chunk_bytes,
        capacity_low_bytes=8 * chunk_bytes,
        eviction_interval_s=0.1,
    )
    try:
        offload(pool, slot=0, context="c-a")
        offload(pool, slot=0, context="c-b")
        stats = pool.stub.Stats(smartnic_pb2.StatsRequest())
        assert set(stats.bytes_by_storage_node) == {"s0", "s1"} and stats.chunks == 8
        restore(pool, 1, IDS, context="c-a")  # c-a is now the most recently used
        offload(pool, slot=0, context="c-c")  # 12 chunks > 10: evict down to 8, least recently used first
        deadline = time.monotonic() + 5
        while pool.stub.Stats(smartnic_pb2.StatsRequest()).contexts > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        contexts = pool.stub.ListContexts(smartnic_pb2.ListContextsRequest(user_id=USER)).contexts
        assert sorted(c.context_id for c in contexts) == ["c-a", "c-c"]
        assert dict(pool.stub.Stats(smartnic_pb2.StatsRequest()).evictions_by_reason) == {"capacity": 1}
    finally:
        pool.close()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_watcher_does_not_burn_a_core_while_waiting(start_service, tmp_path):
    _, agent, pool = start(start_service, tmp_path)
    try:
        pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=pool.put_ops(0, USER, CTX, 64)))
        time.sleep(0.2)
        before = _cpu_s(agent.proc.pid)
        time.sleep(1.0)
        assert _cpu_s(agent.proc.pid) - before < 0.25  # a spinning watcher would use ~1 s
        pool.region.store_counter(LAYOUT.token_counter(0), 64)
        assert pool.wait_counter(LAYOUT.offload_counter(0), 4) == (4, 0)
    finally:
        pool.close()




@pytest.mark.slow
def test_a_node_down_at_start_is_tolerated_and_joins_later(start_service, tmp_path):
    s0 = start_service("storage-s0", "serve", "storage", env=storage_env(tmp_path, "s0"))
    port = free_port()
    late = {"admin": "127.0.0.1:0", "fabric": f"tcp://127.0.0.1:{port}"}
    agent = start_service("agent", "serve", "smartnic", env=agent_env([("s0", s0), ("s1", late)]))
    assert agent.ready["storage_nodes_up"] == ["s0"]
    pool = Pool(smartnic_pb2_grpc.SmartNicStub(secure_channel(agent.addresses["grpc"], peer="smartnic")))
    try:
        offload(pool, context="c-early")
        assert set(pool.stub.Stats(smartnic_pb2.StatsRequest()).bytes_by_storage_node) == {"s0"}
        start_service(
            "storage-s1",
            "serve",
            "storage",
            env={**storage_env(tmp_path, "s1"), "KVTB_STORAGE_FABRIC_ADDRESS": late["fabric"]},
        )
        deadline = time.monotonic() + 10
        contexts = 0
        while time.monotonic() < deadline:
            offload(pool, context=f"c-{contexts}")
            contexts += 1
            if "s1" in pool.stub.Stats(smartnic_pb2.StatsRequest()).bytes_by_storage_node:
                break
            time.sleep(0.2)
        assert "s1" in pool.stub.Stats(smartnic_pb2.StatsRequest()).bytes_by_storage_node
    finally:
        pool.close()
