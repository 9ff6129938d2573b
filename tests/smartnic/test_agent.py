"""The agent's index under several replicas, on an agent never started (no storage node is up): what a
failed GET drops or deletes, and a delete the node refused as leased."""
from __future__ import annotations

import pytest

from hostmem.block_hash import Salts
from smartnic.agent import Agent
from smartnic.landing import DataError
from smartnic.requester import StoredBlock
from smartnic.settings import SmartNicSettings

NODES = ("s0=127.0.0.1:9=tcp://127.0.0.1:9",)  # never connected


@pytest.fixture
def agent():
    a = Agent(SmartNicSettings(storage_nodes=NODES))
    deleted = []
    a.datapath.delete = lambda block, on_refused=None: deleted.append(block.hash)
    a.deleted = deleted
    yield a
    a.close()


def block(name: bytes = b"a" * 16, origin: str = "discovered") -> StoredBlock:
    return StoredBlock(name, b"", "default", "alice", False, 0, 16, "s0", b"k" * 16, 1000, 0, 5, origin=origin)


@pytest.mark.parametrize("kind, deleted", [("key_does_not_exist", False), ("newer_generation", False),
                                           ("timeout", False), ("mac_mismatch", True), ("storage_status", None)])
def test_a_failed_get_drops_the_block_and_deletes_only_what_proved_bad(agent, kind, deleted):
    b = block()
    agent._publish(b, "c1", put=False)
    agent._got(b, DataError(kind, "x"), lambda kind, message: None)
    assert agent.requester.has(b.hash) == (deleted is None)  # a plain failed status keeps it
    assert (b.hash in agent.deleted) == bool(deleted)
    assert ((b.hash, b.generation) in agent.proved_bad) == bool(deleted)  # not discovered again in that generation
    assert agent.stats.snapshot()[0].get("chunks_put", 0) == 0  # found, not put


def test_a_delete_refused_as_leased_puts_the_block_back_to_be_evicted_later(agent):
    b = block(origin="own")
    agent._publish(b, "c1")
    agent.policy.remove(b.hash)
    agent.requester.remove(b.hash)  # as an eviction does before its delete
    agent.evictor.kept_leased(b)
    assert agent.requester.get(b.hash) is b and agent.stats.snapshot()[0]["deletes_refused_leased"] == 1
    assert agent.evictor.evict(now=1e12) == 1 and b.hash in agent.deleted  # the policy names it again (idle past its ttl)


def test_discovery_asks_nothing_when_no_node_is_up_and_a_found_block_never_replaces_the_index_s(agent):
    ids = list(range(64))
    assert agent.discover("alice", "default", ids, Salts.of("default", "alice", 0, 16), 16) == 0
    assert agent.stats.snapshot()[0].get("discovery_requests", 0) == 0
    own = block(origin="own")
    agent._publish(own, "c1")
    agent._publish(block(), "c1", put=False)
    assert agent.requester.get(own.hash) is own


def test_the_replica_settings_are_checked_and_a_read_lease_outlasts_a_get():
    from kvtb.settings import SettingsError
    s = SmartNicSettings(storage_nodes=NODES, read_lease_s=0.5, get_timeout_s=2.0)
    assert s.lease_ms == 2000 and SmartNicSettings(storage_nodes=NODES, read_lease_s=0).lease_ms == 0
    for bad in ({"discovery_timeout_s": 0}, {"read_lease_s": -1}, {"replica": ""}, {"compute_identity": ""}):
        with pytest.raises(SettingsError):
            SmartNicSettings(storage_nodes=NODES, **bad)
