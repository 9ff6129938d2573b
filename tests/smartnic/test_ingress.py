"""Step 5 as plain logic: the table's decision, the owner check, the target, the prefetch plan."""
from __future__ import annotations

import pytest

from smartnic import ingress
from smartnic.agent import Agent
from smartnic.match_action import DENY, FORWARD, RATE_LIMIT, Action, Entry, Match
from smartnic.requester import Chunk
from smartnic.settings import SmartNicSettings

NODES = ("s0=127.0.0.1:9=tcp://127.0.0.1:9",)  # never connected: the agent is not started
PACKET = ingress.Packet("alice", "c1", "10.1.2.3", 40000, "127.0.0.1", 50051)


@pytest.fixture
def agent():
    a = Agent(SmartNicSettings(storage_nodes=NODES, compute_address="127.0.0.1:7"))  # never started
    yield a
    a.close()


def never_reserve(address):
    raise AssertionError("no prefetch was expected")


def test_deny_and_rate_limit_refuse_with_their_kind(agent):
    agent.write_table([("insert", "", Entry((Match("user_id", "exact", "alice"),), 1, Action(DENY)))])
    with pytest.raises(ingress.Refused) as refused:
        ingress.plan(agent, PACKET, [1, 2, 3], never_reserve)
    assert refused.value.kind == "denied" and agent.stats.snapshot()[0]["denied"] == 1
    agent.write_table([("insert", "", Entry((Match("user_id", "exact", "alice"),), 9,
                                            Action(RATE_LIMIT, rate_per_s=0.001, burst=1)))])
    ingress.plan(agent, PACKET, [1, 2, 3], lambda address: None)  # the burst
    with pytest.raises(ingress.Refused) as refused:
        ingress.plan(agent, PACKET, [1, 2, 3], lambda address: None)
    assert refused.value.kind == "rate_limited"


def test_another_users_context_is_refused(agent):
    agent.requester.publish("bob", "c1", Chunk(0, 0, 3, "s0", b"k" * 16, 100, 0, b"h" * 16), now=0.0)
    with pytest.raises(ingress.Refused) as refused:
        ingress.plan(agent, PACKET, [1, 2, 3], never_reserve)
    assert refused.value.kind == "denied" and "another user" in str(refused.value)


def test_forward_goes_to_the_configured_node_without_a_prefetch(agent):
    agent.write_table([("insert", "", Entry((), 1, Action(FORWARD)))])
    plan = ingress.plan(agent, PACKET, [1, 2, 3], never_reserve)
    assert plan.compute_address == "127.0.0.1:7" and plan.restore is None and plan.action.type == FORWARD


def test_no_compute_node_known():
    a = Agent(SmartNicSettings(storage_nodes=NODES))
    try:
        with pytest.raises(ingress.NoComputeNode):
            ingress.plan(a, PACKET, [1, 2, 3], never_reserve)
    finally:
        a.close()
