"""The agent with real storage node processes; this test process stands in for the compute node."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from kvtb_proto import smartnic_pb2, smartnic_pb2_grpc
from fabric import chunk_format as cf
from tests.smartnic.helpers import KEY, LAYOUT, Pool, agent_env, storage_env
from tests.conftest import CREDENTIALS, fabric_client, secure_channel

USER, CTX = "alice", "ctx-1"
IDS = np.arange(1000, 1064, dtype=np.uint32)


@pytest.fixture
def storage(start_service, tmp_path):
    return [("s0", start_service("storage-s0", "serve", "storage", env=storage_env(tmp_path, "s0")))]


@pytest.fixture
def agent(start_service, storage):
    proc = start_service("agent", "serve", "smartnic", env=agent_env(storage))
    channel = secure_channel(proc.addresses["grpc"], peer="smartnic")
    yield proc, smartnic_pb2_grpc.SmartNicStub(channel)
    channel.close()


@pytest.fixture
def pool(agent):
    p = Pool(agent[1])
    yield p
    p.close()


def offload(pool: Pool, slot: int = 0, num_tokens: int = 64, user: str = USER, context: str = CTX) -> None:
    """Queue the PUTs of a slot, bump its token counter, wait for the offload counter."""
    pool.fill(slot, IDS[:num_tokens])
    pool.region.store_counter(LAYOUT.token_counter(slot), 0)
    base = pool.region.counter_total(LAYOUT.offload_counter(slot))
    ops = pool.put_ops(slot, user, context, num_tokens)
    pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=ops))
    pool.region.store_counter(LAYOUT.token_counter(slot), 40)  # the "GPU thread": a plain store
    assert pool.wait_counter(LAYOUT.offload_counter(slot), base + 2) == (base + 2, 0)
    pool.region.store_counter(LAYOUT.token_counter(slot), num_tokens)
    assert pool.wait_counter(LAYOUT.offload_counter(slot), base + len(ops)) == (base + len(ops), 0)


def restore(pool: Pool, slot: int, token_ids, user: str = USER, context: str = CTX):
    return pool.stub.Restore(
        smartnic_pb2.RestoreRequest(
            region_id=pool.region_id,
            access_key=KEY,
            context=smartnic_pb2.ContextRef(user_id=user, context_id=context),
            slot=slot,
            token_ids=[int(t) for t in token_ids],
        )
    )


def test_put_stores_the_bytes_and_get_restores_them(pool, storage):
    offload(pool)
    found = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX))
    assert [c.chunk_index for c in found.chunks] == [0, 1, 2, 3]
    # the stored value is header + token ids + KV in layout order
    with fabric_client(storage[0][1].addresses["fabric"]) as client:
        value = bytes(client.retrieve(1, found.chunks[1].key).payload())
    header, n = cf.decode_header(value)
    assert (header.user_id, header.chunk_index, header.token_start, header.token_end) == (USER, 1, 16, 32)
    assert value[n : n + 64] == IDS[16:32].tobytes()
    assert value[n + 64 : -cf.MAC_BYTES] == np.ascontiguousarray(pool.kv(0)[:, :, :, 16:32, :]).tobytes()
    # ... and the MAC under the deployment's kv-mac.key, over the key, the generation and those bytes
    mac_key = (CREDENTIALS / "kv-mac.key").read_bytes()
    assert header.generation > 0 and header.mac_bytes == cf.MAC_BYTES
    assert value[-cf.MAC_BYTES:] == cf.mac_of(mac_key, found.chunks[1].key, header.generation,
                                              [value[:-cf.MAC_BYTES]])
    # GET into the other slot of another region: exactly those bytes, and the restore counter
    other = Pool(pool.stub)
    try:
        info = restore(other, 1, list(IDS) + [7, 8])
        assert (info.chunks, info.tokens_announced, info.error_base) == (4, 64, 0)
        success, error = other.wait_counter(info.completion_counter, info.threshold)
        assert (success, error) == (4, 0) and info.completion_counter == LAYOUT.restore_counter(1)
        assert np.array_equal(other.kv(1), pool.kv(0)) and np.array_equal(other.token_ids(1), IDS)
    finally:
        other.close()
    stats = pool.stub.Stats(smartnic_pb2.StatsRequest())
    assert stats.hits == 1 and stats.chunks == 4 and stats.bytes_got == stats.bytes_put > 0
    assert stats.triggered_fired >= 8 and stats.trigger_to_fire_p99_us > 0


def test_gets_in_data_pdus_restore_exactly_the_bytes_put(start_service, storage):
    # chunks of 4,240 bytes asked for in PDUs of 4,096: each arrives in two, cut mid-row
    proc = start_service("agent-pdus", "serve", "smartnic", env=agent_env(storage, get_pdu_bytes=4096))
    channel = secure_channel(proc.addresses["grpc"], peer="smartnic")
    source, target = Pool(smartnic_pb2_grpc.SmartNicStub(channel)), None
    try:
        offload(source)
        target = Pool(source.stub)
        info = restore(target, 1, list(IDS))
        assert target.wait_counter(info.completion_counter, info.threshold) == (4, 0)
        assert np.array_equal(target.kv(1), source.kv(0)) and np.array_equal(target.token_ids(1), IDS)
        stats = source.stub.Stats(smartnic_pb2.StatsRequest())
        assert stats.bytes_got == stats.bytes_put > 4 * 4096
    finally:
        for p in (source, target):
            if p is not None:
                p.close()
        channel.close()


def test_restore_covers_only_the_matching_prefix(pool):
    offload(pool)
    diverged = list(IDS[:40]) + [1] * 30
    info = restore(pool, 1, diverged)
    assert (info.chunks, info.tokens_announced) == (2, 32)
    pool.wait_counter(info.completion_counter, info.threshold)
    assert restore(pool, 1, [5, 6, 7]).chunks == 0


def test_another_users_context_is_denied(pool):
    offload(pool)
    with pytest.raises(grpc.RpcError) as err:
        restore(pool, 1, IDS, user="mallory")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        pool.stub.Lookup(smartnic_pb2.ContextRef(user_id="mallory", context_id=CTX))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:  # nor may anyone write into it
        pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=pool.put_ops(1, "mallory", CTX, 16)))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_chained_counter_ops_and_cancel(pool):
    a, b, c = (LAYOUT.extra_counter(i) for i in range(3))
    op = smartnic_pb2.TriggeredOp
    pool.stub.QueueTriggered(
        smartnic_pb2.QueueTriggeredRequest(
            ops=[
                op(
                    region_id=pool.region_id,
                    access_key=KEY,
                    trigger_counter=a,
                    threshold=3,
                    counter_add=smartnic_pb2.CounterOp(counter=b, value=5),
                ),
                op(
                    region_id=pool.region_id,
                    access_key=KEY,
                    trigger_counter=b,
                    threshold=5,
                    counter_set=smartnic_pb2.CounterOp(counter=c, value=42),
                ),
                op(
                    region_id=pool.region_id,
                    access_key=KEY,
                    trigger_counter=c,
                    threshold=100,
                    counter_set=smartnic_pb2.CounterOp(counter=a, value=0),
                ),
            ]
        )
    )
    pool.region.store_counter(a, 2)
    pool.stub.CounterAdd(
        smartnic_pb2.CounterUpdateRequest(
            counter=smartnic_pb2.CounterRef(region_id=pool.region_id, access_key=KEY, counter=a), error=1
        )
    )
    value = pool.stub.CounterWait(
        smartnic_pb2.CounterWaitRequest(
            counter=smartnic_pb2.CounterRef(region_id=pool.region_id, access_key=KEY, counter=c),
            threshold=42,
            timeout_s=5,
        )
    )
    assert value.success == 42 and pool.region.read_counter(b) == (5, 0)
    cancelled = pool.stub.CancelCounter(
        smartnic_pb2.CancelRequest(
            counter=smartnic_pb2.CounterRef(region_id=pool.region_id, access_key=KEY, counter=c)
        )
    )
    assert cancelled.cancelled == 1
    assert pool.stub.Stats(smartnic_pb2.StatsRequest()).queue_depth == 0


def test_queue_bound_bad_key_and_bounds(pool):
    ops = [
        smartnic_pb2.TriggeredOp(
            region_id=pool.region_id,
            access_key=KEY,
            trigger_counter=LAYOUT.extra_counter(0),
            threshold=10**9,
            counter_add=smartnic_pb2.CounterOp(counter=0, value=1),
        )
    ]
    with pytest.raises(grpc.RpcError) as err:
        pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=ops * 513))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=ops * 512))
    assert (
        pool.stub.Flush(smartnic_pb2.FlushRequest(region_id=pool.region_id, access_key=KEY)).cancelled == 512
    )
    with pytest.raises(grpc.RpcError) as err:
        pool.stub.CounterRead(
            smartnic_pb2.CounterRef(region_id=pool.region_id, access_key="wrong", counter=0)
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        pool.stub.CounterRead(
            smartnic_pb2.CounterRef(region_id=pool.region_id, access_key=KEY, counter=10**6)
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = pool.put_ops(0, USER, CTX, 16, by_ranges=True)[0]
    bad.put.ranges[0].offset = LAYOUT.region_bytes - 8  # runs past the end of the region
    with pytest.raises(grpc.RpcError) as err:
        pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=[bad]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the region" in err.value.details()
    both = pool.put_ops(0, USER, CTX, 16, by_ranges=True)[0]
    both.put.slot = 0  # names its source twice
    missing = pool.put_ops(0, USER, CTX, 16)[0]
    missing.put.slot = LAYOUT.num_slots  # a slot the registered layout does not have
    for bad in (both, missing):
        with pytest.raises(grpc.RpcError) as err:
            pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=[bad]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.slow
def test_restart_rebuilds_the_hashmap(start_service, storage, pool, agent):
    offload(pool)
    before = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX))
    pool.region.close()
    agent[0].stop()
    proc = start_service("agent-again", "serve", "smartnic", env=agent_env(storage))
    with secure_channel(proc.addresses["grpc"], peer="smartnic") as channel:
        stub = smartnic_pb2_grpc.SmartNicStub(channel)
        after = stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX))
        assert [(c.key, c.crc32c, c.length, c.token_end) for c in after.chunks] == [
            (c.key, c.crc32c, c.length, c.token_end) for c in before.chunks
        ]
        fresh = Pool(stub)
        try:
            info = restore(fresh, 0, IDS)
            assert fresh.wait_counter(info.completion_counter, info.threshold) == (4, 0)
            assert np.array_equal(fresh.token_ids(0), IDS)
        finally:
            fresh.close()


@pytest.mark.slow
def test_storage_node_down_ends_gets_with_errors_in_bounded_time(pool, storage):
    offload(pool)
    storage[0][1].stop()
    start = time.monotonic()
    info = restore(pool, 1, IDS)
    success, error = pool.wait_counter(info.completion_counter, info.threshold, timeout_s=5)
    assert error - info.error_base == 4 and success == 0
    assert time.monotonic() - start < 3.0
    kinds = {
        e.kind
        for e in pool.stub.ReadErrors(
            smartnic_pb2.ReadErrorsRequest(region_id=pool.region_id, access_key=KEY)
        ).errors
    }
    assert kinds <= {"timeout", "storage_unavailable"} and kinds
    # the failed chunks were dropped: the next restore announces nothing
    assert restore(pool, 1, IDS).chunks == 0


def test_a_put_reads_the_region_when_it_fires_not_when_queued(pool):
    pool.fill(0, IDS, seed=1)
    pool.region.store_counter(LAYOUT.token_counter(0), 0)
    pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=pool.put_ops(0, USER, CTX, 64)))
    pool.fill(0, IDS, seed=2)  # the KV changes after queuing, before the trigger
    expected = pool.kv(0).copy()
    pool.region.store_counter(LAYOUT.token_counter(0), 64)
    pool.wait_counter(LAYOUT.offload_counter(0), 4)
    info = restore(pool, 1, IDS)
    assert pool.wait_counter(info.completion_counter, info.threshold) == (4, 0)
    assert np.array_equal(pool.kv(1), expected)
