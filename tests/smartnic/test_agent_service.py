"""The agent with real storage node processes; this test process stands in for the compute node:
standing PUTs stored by descriptor, restores asked for on the Generate stream, the requester's views."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from fabric import chunk_format as cf
from hostmem.block_hash import block_hash, hash_chain, salt_for
from kvtb_proto import (
    compute_pb2,
    compute_pb2_grpc,
    smartnic_pb2,
    smartnic_pb2_grpc,
    storage_admin_pb2,
    storage_admin_pb2_grpc,
)
from tests.conftest import CREDENTIALS, fabric_client, secure_channel
from tests.smartnic.helpers import KEY, LAYOUT, PlainPool, agent_env

USER, CTX = "alice", "ctx-1"
IDS = list(range(1000, 1060))  # three full blocks of 16 and a partial one of 12


def turn(channel, ids, user: str = USER, context: str = CTX, tenant: str = "default", shared: int = 0) -> list:
    stub = compute_pb2_grpc.ComputeNodeStub(channel)
    return list(stub.Generate(compute_pb2.TurnRequest(request_id="r1", user_id=user, context_id=context,
                                                      tenant=tenant, token_ids=ids, max_new_tokens=1,
                                                      shared_prefix_tokens=shared), timeout=30))


def stats(pool):
    return pool.stub.Stats(smartnic_pb2.StatsRequest())


def test_a_block_leaves_by_its_descriptor_and_comes_back_bit_identical(compute, storage):
    pool, fake, channel = compute
    names = pool.offload(IDS, USER, CTX)
    assert names[:3] == hash_chain(IDS, salt_for("default", USER), 16)
    found = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX))
    assert [c.chunk_index for c in found.chunks] == [0, 1, 2, 3] and [c.hash for c in found.chunks] == names
    assert [c.token_end - c.token_start for c in found.chunks] == [16, 16, 16, 12]
    # the stored value: header, the block's token ids, its MACs (the head's, one per layer), its whole KV extent
    with fabric_client(storage[0][1].addresses["fabric"]) as client:
        value = bytes(client.retrieve(1, found.chunks[1].key).payload())
    header, n = cf.decode_header(value)
    layout = cf.value_layout(header, n)
    assert (header.user_id, header.tenant, header.chunk_index, header.name) == (USER, "default", 1, names[1])
    assert header.parent == names[0] and value[n:n + 64] == np.asarray(IDS[16:32], "<u4").tobytes()
    assert header.kv_parts == LAYOUT.num_layers and value[layout.kv_offset:] == pool.kv(1).tobytes()
    mac_key = (CREDENTIALS / "kv-mac.key").read_bytes()
    assert cf.check_value(mac_key, found.chunks[1].key, value)[0] == header
    # a follow-up: step 5 finds the stored prefix by content, the stream asks, the GETs land in blocks 4..7
    follow = IDS + [7, 8, 9]
    events = turn(channel, follow)
    assert fake.requests[-1].stored_tokens == len(IDS)
    assert fake.outcomes[-1] == [(2, 0)] * 4  # each block: both layer groups, success
    for source, target in zip(range(4), range(4, 8)):
        assert np.array_equal(pool.kv(target), pool.kv(source))
        assert np.array_equal(pool.token_ids(target), pool.token_ids(source))
    record = events[-1].record
    assert record.kv_source == "restored" and {s.step for s in record.steps} >= {5, 6, 8}
    # one bulk GET per layer group for all four blocks, no GET per block
    admin = storage_admin_pb2_grpc.StorageAdminStub(secure_channel(storage[0][1].addresses["admin"], peer="storage"))
    commands = {(c.opcode, c.status): c.count for c in admin.Stats(storage_admin_pb2.StatsRequest()).commands}
    assert commands[("kv_retrieve_ranges", "success")] == LAYOUT.layer_groups
    assert commands.get(("kv_retrieve", "success"), 0) == 1  # the test's own read of the value above
    s = stats(pool)
    assert s.hits == 1 and s.chunks == 4 and s.bytes_got == s.bytes_put > 0 and s.triggered_fired >= 4


def test_a_prefix_is_found_whatever_context_stored_it_but_never_for_another_user(compute):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    turn(channel, IDS[:40] + [1] * 30, context="another-context")  # diverges in block 2
    assert fake.requests[-1].stored_tokens == 32 and fake.outcomes[-1] == [(2, 0)] * 2
    turn(channel, IDS + [7], user="mallory")
    assert fake.requests[-1].stored_tokens == 0
    turn(channel, IDS + [7], tenant="other-tenant")
    assert fake.requests[-1].stored_tokens == 0
    # the operator's view is by (user, context): mallory has none of alice's
    assert not pool.stub.Lookup(smartnic_pb2.ContextRef(user_id="mallory", context_id=CTX)).chunks


def test_a_shared_prefix_serves_the_tenants_other_users_and_never_another_tenant(compute):
    pool, fake, channel = compute
    names = pool.offload(IDS, USER, CTX, tenant="acme", shared_tokens=40)  # blocks 0, 1 lie inside it
    found = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX)).chunks
    assert [c.shared for c in found] == [True, True, False, False] and [c.hash for c in found] == names
    turn(channel, IDS + [7], user="bob", tenant="acme", shared=40)
    assert fake.requests[-1].stored_tokens == 32 and fake.outcomes[-1] == [(2, 0)] * 2
    for source, target in zip(range(2), range(4, 6)):  # alice's shared blocks, GOT for bob
        assert np.array_equal(pool.kv(target), pool.kv(source))
    turn(channel, IDS + [7], user=USER, tenant="acme", shared=40)  # alice: hers too
    assert fake.requests[-1].stored_tokens == len(IDS) and fake.outcomes[-1] == [(2, 0)] * 4
    turn(channel, IDS + [7], user="bob", tenant="acme")  # the frontend did not mark it shared: nothing
    assert fake.requests[-1].stored_tokens == 0
    turn(channel, IDS + [7], user="bob", tenant="other-tenant", shared=40)  # another tenant: nothing
    assert fake.requests[-1].stored_tokens == 0
    # a partial block is never shared: a descriptor saying so is refused, whatever its name
    partial = IDS[48:]
    shared_salt = salt_for("acme", USER, shared=True)
    _, before = pool.store(3, 3, IDS, USER, "bad-shared", tenant="acme", shared_tokens=40, overrides=dict(
        shared=True, hash=block_hash(names[2], partial, shared_salt)))  # its name under the shared salt
    assert pool.wait_counter(LAYOUT.put_done(3), sum(before) + 1) == (before[0], before[1] + 1)
    assert stats(pool).errors_by_kind["descriptor_refused"] == 1


def test_a_descriptor_that_does_not_describe_its_block_is_refused_and_counted(compute):
    pool, _, _ = compute
    cases = [dict(hash=b"x" * 16),                 # a name that is not the block's tokens under its owner
             dict(user="mallory"),                 # another owner: the name does not fit
             dict(tenant="other-tenant"),          # another tenant: nor does it
             dict(shared=True),                    # the tenant's shared salt: nor does it
             dict(generation=99),                  # not the generation stored in the trigger
             dict(chunk_index=2**32 - 1, parent=b"p" * 16)]  # tokens past what a chunk header holds
    for i, case in enumerate(cases):
        _, before = pool.store(0, 0, IDS, USER, f"bad-{i}", overrides=case)
        assert pool.wait_counter(LAYOUT.put_done(0), sum(before) + 1) == (before[0], before[1] + 1), case
    # stale: the last descriptor left in place, the trigger moved on without a new one
    before = pool.region.read_counter(LAYOUT.put_done(0))
    pool.region.store_counter(LAYOUT.put_trigger(0), pool.region.read_counter(LAYOUT.put_trigger(0))[0] + 1)
    assert pool.wait_counter(LAYOUT.put_done(0), sum(before) + 1) == (before[0], before[1] + 1)
    garbage = bytes(range(256)) * 2
    pool.region.write(LAYOUT.descriptor_range(0)[0], garbage)
    before = pool.region.read_counter(LAYOUT.put_done(0))
    pool.region.store_counter(LAYOUT.put_trigger(0), pool.region.read_counter(LAYOUT.put_trigger(0))[0] + 1)
    assert pool.wait_counter(LAYOUT.put_done(0), sum(before) + 1) == (before[0], before[1] + 1)
    s = stats(pool)
    assert s.errors_by_kind["descriptor_refused"] == len(cases) + 2 and s.chunks == 0 and s.bytes_put == 0
    # the same block's next generation fires again (the agent re-armed it) and is stored under its name
    names = pool.offload(IDS[:16], USER, CTX, blocks=[0])
    assert names == hash_chain(IDS[:16], salt_for("default", USER), 16)
    assert [c.hash for c in pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX)).chunks] == names
    assert stats(pool).chunks == 1 and stats(pool).errors_by_kind["descriptor_refused"] == len(cases) + 2
    for i in range(len(cases)):  # nothing of the refused ones under any name
        assert not pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=f"bad-{i}")).chunks
    assert not pool.stub.Lookup(smartnic_pb2.ContextRef(user_id="mallory", context_id="bad-1")).chunks
    assert fake_turn_finds(compute) == 16  # step 5 finds it for its owner, and for nobody else
    assert fake_turn_finds(compute, user="mallory") == 0 and fake_turn_finds(compute, tenant="other-tenant") == 0


def fake_turn_finds(compute, **who) -> int:
    """The stored prefix step 5 finds for IDS[:16] + one token, as `who` (the fake compute node's view)."""
    _, fake, channel = compute
    turn(channel, IDS[:16] + [7], **who)
    return fake.requests[-1].stored_tokens


def test_a_put_reads_the_block_when_it_fires(compute):
    pool, fake, channel = compute
    pool.offload(IDS[:16], USER, CTX)
    first = pool.kv(0).copy()
    pool.offload(IDS[:16] + [5] * 16, USER, CTX, blocks=[0, 1])  # block 0 rewritten the same, block 1 new
    assert np.array_equal(pool.kv(0), first)
    assert stats(pool).chunks == 2


def test_a_storage_node_down_ends_the_restore_with_errors_in_bounded_time(compute, storage):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    storage[0][1].pause()
    try:
        start = time.monotonic()
        turn(channel, IDS + [7])
        assert time.monotonic() - start < 8
        assert all(err for _, err in fake.outcomes[-1])  # every block ended on its error part
    finally:
        storage[0][1].resume()


def test_one_off_puts_gets_and_counter_ops_of_a_plain_region(agent):
    plain = PlainPool(agent[1])
    try:
        ids_range, kv_range = (0, 64), (4096, 8192)
        plain.region.write(0, np.arange(16, dtype="<u4").tobytes())
        plain.region.write(4096, np.arange(2048, dtype=np.float32).tobytes())
        a, b, c, done = 0, 1, 2, 3
        ops = [plain.op("put", a, 1, done, USER, "plain", 0, ids_range, kv_range),
               smartnic_pb2.TriggeredOp(region_id=plain.region_id, access_key=KEY, trigger_counter=done,
                                        threshold=1, counter_add=smartnic_pb2.CounterOp(counter=b, value=5)),
               plain.op("get", b, 5, c, USER, "plain", 0, (20480, 64), (24576, 8192))]
        plain.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=ops))
        plain.region.store_counter(a, 1)
        assert plain.wait_counter(c, 1) == (1, 0)
        assert bytes(plain.region.view(20480, 64)) == bytes(plain.region.view(0, 64))
        assert bytes(plain.region.view(24576, 8192)) == bytes(plain.region.view(4096, 8192))
        with pytest.raises(grpc.RpcError) as err:
            plain.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=[
                plain.op("put", a, 2, done, USER, "plain", 1, (0, 64), (1 << 20, 4096))]))  # past the end
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "outside the region" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            plain.stub.CounterRead(smartnic_pb2.CounterRef(region_id=plain.region_id, access_key="wrong", counter=0))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        plain.close()


def test_one_off_data_ops_are_refused_on_a_pool_with_a_layout(compute):
    pool, _, _ = compute
    op = smartnic_pb2.TriggeredOp(region_id=pool.region_id, access_key=KEY, trigger_counter=LAYOUT.extra_counter(0),
                                  threshold=1, completion_counter=LAYOUT.extra_counter(1),
                                  put=smartnic_pb2.PutOp(chunk=smartnic_pb2.ChunkRef(
                                      user_id=USER, context_id=CTX, chunk_index=0, token_start=0, token_end=16)))
    with pytest.raises(grpc.RpcError) as err:
        pool.stub.QueueTriggered(smartnic_pb2.QueueTriggeredRequest(ops=[op]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "standing PUTs" in err.value.details()


def test_restart_rebuilds_the_index_from_the_blocks_headers(start_service, storage, compute, agent):
    pool, fake, channel = compute
    names = pool.offload(IDS, USER, CTX)
    agent[0].stop()
    proc = start_service("agent-again", "serve", "smartnic", env={**agent_env(storage),
                                                                  "KVTB_SMARTNIC_LISTEN_ADDRESS": agent[0].addresses["grpc"]})
    with secure_channel(proc.addresses["grpc"], peer="smartnic") as ch:
        stub = smartnic_pb2_grpc.SmartNicStub(ch)
        deadline = time.monotonic() + 20
        while stub.Stats(smartnic_pb2.StatsRequest()).chunks < 4:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        found = stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX))
        assert [c.hash for c in found.chunks] == names
