"""Step 5 as plain logic: the table's decision, the target, the stored prefix's lookup."""
from __future__ import annotations

import pytest

from smartnic import ingress
from smartnic.agent import Agent
from smartnic.match_action import DENY, FORWARD, RATE_LIMIT, Action, Entry, Match
from smartnic.settings import SmartNicSettings

NODES = ("s0=127.0.0.1:9=tcp://127.0.0.1:9",)  # never connected: the agent is not started
PACKET = ingress.Packet("alice", "c1", "10.1.2.3", 40000, "127.0.0.1", 50051)


@pytest.fixture
def agent():
    a = Agent(SmartNicSettings(storage_nodes=NODES, compute_address="127.0.0.1:7"))  # never started
    yield a
    a.close()


def test_deny_and_rate_limit_refuse_with_their_kind(agent):
    agent.tables.write([("insert", "", Entry((Match("user_id", "exact", "alice"),), 1, Action(DENY)))])
    with pytest.raises(ingress.Refused) as refused:
        ingress.plan(agent, PACKET, "default", [1, 2, 3])
    assert refused.value.kind == "denied" and agent.stats.snapshot()[0]["denied"] == 1
    agent.tables.write([("insert", "", Entry((Match("user_id", "exact", "alice"),), 9,
                                            Action(RATE_LIMIT, rate_per_s=0.001, burst=1)))])
    ingress.plan(agent, PACKET, "default", [1, 2, 3])  # the burst
    with pytest.raises(ingress.Refused) as refused:
        ingress.plan(agent, PACKET, "default", [1, 2, 3])
    assert refused.value.kind == "rate_limited"


def test_forward_goes_to_the_configured_node_without_a_prefetch(agent):
    agent.tables.write([("insert", "", Entry((), 1, Action(FORWARD)))])
    plan = ingress.plan(agent, PACKET, "default", [1, 2, 3])
    assert plan.compute_address == "127.0.0.1:7" and plan.stored_tokens == 0 and plan.action.type == FORWARD


def test_no_compute_node_known():
    a = Agent(SmartNicSettings(storage_nodes=NODES))
    try:
        with pytest.raises(ingress.NoComputeNode):
            ingress.plan(a, PACKET, "default", [1, 2, 3])
    finally:
        a.close()
