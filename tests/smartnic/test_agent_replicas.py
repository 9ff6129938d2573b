"""Two agents (two replicas) sharing real storage node processes; this test process plays both compute
nodes: the miss path finds what the other agent stored, leases keep a block one agent restores from the
other's eviction, and a block deleted under an agent is dropped from its index."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest

from fabric import chunk_format as cf
from fabric.placement import place
from hostmem.block_hash import hash_chain, salt_for
from kvtb.credentials import AGENT_NQN
from kvtb_proto import smartnic_pb2
from tests.conftest import TEST_HOST, fabric_client
from tests.smartnic.conftest import compute_beside
from tests.smartnic.helpers import agent_env, storage_env
from tests.smartnic.test_agent_service import CTX, IDS, USER, turn

B_NQN = "nqn.2026-11.org.kvtestbed:smartnic-1"
NODES = ("s0", "s1")


def keys_of(ids) -> list[bytes]:
    """The storage keys of the full blocks of ids (alice's)."""
    return [cf.block_key("test-salt", name) for name in hash_chain(ids, salt_for("default", USER), 16)]


def homes(ids) -> list[str]:
    return [place(k, list(NODES)) for k in keys_of(ids)]


KEYS = keys_of(IDS)
# three full blocks and a partial one whose first two blocks live on different nodes
SPREAD = next(ids for ids in (list(range(b, b + 60)) for b in range(5000, 9000, 60))
              if homes(ids)[0] != homes(ids)[1])


def stats(pool) -> smartnic_pb2.StatsResponse:
    return pool.stub.Stats(smartnic_pb2.StatsRequest())


def record(events):
    return [e.record for e in events if e.HasField("record")][-1]


def start(start_service, tmp_path, a: dict | None = None, b: dict | None = None):
    """Two storage nodes (allowing both agents and the tests' host), agent A (replica-0) and agent B (replica-1)."""
    storage = []
    for n in NODES:
        env = storage_env(tmp_path, n)
        env["KVTB_STORAGE_ALLOWED_HOSTS"] = json.dumps({AGENT_NQN: "*", B_NQN: "*", TEST_HOST: "*"})
        storage.append((n, start_service(f"storage-{n}", "serve", "storage", env=env)))
    agent_a = start_service("agent-a", "serve", "smartnic", env=agent_env(storage, **(a or {})))
    agent_b = start_service("agent-b", "serve", "smartnic", env=agent_env(
        storage, host_nqn=B_NQN, replica="replica-1", **(b or {})))
    return storage, agent_a, agent_b


def keys_on(storage) -> set[bytes]:
    out = set()
    for _, proc in storage:
        with fabric_client(proc.addresses["fabric"]) as client:
            out |= set(client.list_keys(1))
    return out


def test_an_agent_finds_and_restores_what_the_other_stored_one_request_per_node(start_service, tmp_path):
    storage, agent_a, agent_b = start(start_service, tmp_path)
    with compute_beside(agent_a.addresses["grpc"]) as (pool_a, _, _), \
            compute_beside(agent_b.addresses["grpc"]) as (pool_b, fake_b, channel_b):
        pool_a.offload(SPREAD, USER, CTX)
        events = turn(channel_b, SPREAD + [7])
        assert fake_b.requests[-1].stored_tokens == 48  # the full blocks (a partial one is never asked for)
        assert fake_b.outcomes[-1] == [(2, 0)] * 3
        for i, target in enumerate(fake_b.targets[:3]):  # what A's compute node wrote, bit for bit
            assert (pool_b.kv(target) == pool_a.kv(i)).all()
        r = record(events)
        assert (r.replica, r.blocks_restored, r.blocks_restored_other) == ("replica-1", 3, 3)
        s = stats(pool_b)
        assert (s.discovery_requests, s.discovered_blocks, s.discovery_timeouts) == (2, 3, 0)  # one per node
        turn(channel_b, SPREAD + [7])  # now in B's own index: nothing more asked
        assert stats(pool_b).discovery_requests == 2
        assert fake_b.requests[-1].stored_tokens == 48


@pytest.mark.parametrize("field, value", [("user_id", "carol"), ("tenant", "defaulx")])
def test_a_block_whose_header_names_another_owner_is_not_taken(start_service, tmp_path, field, value):
    storage, agent_a, agent_b = start(start_service, tmp_path)
    with compute_beside(agent_a.addresses["grpc"]) as (pool_a, _, _), \
            compute_beside(agent_b.addresses["grpc"]) as (pool_b, fake_b, channel_b):
        pool_a.offload(IDS, USER, CTX)
        node = dict(storage)[place(KEYS[0], list(NODES))]
        with fabric_client(node.addresses["fabric"]) as client:  # someone with the node's files rewrites a header
            stored = bytes(client.retrieve(1, KEYS[0]).payload())
            header, n = cf.decode_header(stored)
            client.store(1, KEYS[0], [cf.encode_header(dataclasses.replace(header, **{field: value})) + stored[n:]])
        turn(channel_b, IDS + [7], user="bob")  # another user's names: other keys, nothing found
        assert fake_b.requests[-1].stored_tokens == 0 and stats(pool_b).discovered_blocks == 0
        turn(channel_b, IDS + [7])
        assert fake_b.requests[-1].stored_tokens == 0  # block 0 not taken: the prefix ends before it
        assert stats(pool_b).discovered_blocks == 2


def test_a_node_that_does_not_answer_holds_a_lookup_no_longer_than_the_deadline(start_service, tmp_path):
    storage, agent_a, agent_b = start(start_service, tmp_path, b={"discovery_timeout_s": 0.5})
    with compute_beside(agent_a.addresses["grpc"]) as (pool_a, _, _), \
            compute_beside(agent_b.addresses["grpc"]) as (pool_b, fake_b, channel_b):
        pool_a.offload(SPREAD, USER, CTX)
        silent = homes(SPREAD)[1]
        dict(storage)[silent].pause()
        try:
            start_s = time.monotonic()
            turn(channel_b, SPREAD + [7])
            took = time.monotonic() - start_s
        finally:
            dict(storage)[silent].resume()
        assert fake_b.requests[-1].stored_tokens == 16  # block 0 found; block 1's node did not answer in time
        assert took < 0.5 + 1.0
        assert stats(pool_b).discovery_timeouts == 1


def test_a_block_leased_by_one_agent_survives_the_other_s_eviction_until_the_lease_ends(start_service, tmp_path):
    storage, agent_a, agent_b = start(start_service, tmp_path,
                                      a={"eviction_policy": "timer", "ttl_s": 2.0, "eviction_interval_s": 0.2},
                                      b={"read_lease_s": 3.0})
    with compute_beside(agent_a.addresses["grpc"]) as (pool_a, _, _), \
            compute_beside(agent_b.addresses["grpc"]) as (pool_b, fake_b, channel_b):
        pool_a.offload(IDS, USER, CTX)
        turn(channel_b, IDS + [7])  # B finds A's blocks (leasing them) and restores them
        assert fake_b.outcomes[-1] == [(2, 0)] * 3
        deadline = time.monotonic() + 10
        while stats(pool_a).deletes_refused_leased < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stats(pool_a).deletes_refused_leased == 3  # A's eviction: every full block kept by B's lease
        assert set(KEYS) <= keys_on(storage)
        turn(channel_b, IDS + [7])  # B restores them again while A keeps trying
        assert fake_b.requests[-1].stored_tokens == 48 and fake_b.outcomes[-1] == [(2, 0)] * 3
        deadline = time.monotonic() + 15
        while set(KEYS) & keys_on(storage) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not set(KEYS) & keys_on(storage)  # the lease ended: A's eviction went through
        # B's index still names them: its GETs find "key does not exist" and drop them, deleting nothing
        turn(channel_b, IDS + [7])
        assert fake_b.requests[-1].stored_tokens == 48 and all(e for _, e in fake_b.outcomes[-1])
        assert stats(pool_b).errors_by_kind["key_does_not_exist"] == 3
        turn(channel_b, IDS + [7])
        assert fake_b.requests[-1].stored_tokens == 0
        assert stats(pool_b).chunks == 0
