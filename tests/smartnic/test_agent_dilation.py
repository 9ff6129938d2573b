"""The agent under a hardware profile: its idle timer counts virtual seconds."""
from __future__ import annotations

from scale import dilation
from smartnic.agent import Agent
from smartnic.settings import SmartNicSettings

NODES = ("s0=127.0.0.1:9=tcp://127.0.0.1:9",)  # never connected: the agent is not started


def test_the_idle_timer_is_in_virtual_seconds_under_a_profile():
    """At D = 4 a context idle ttl_s of virtual time has been idle 4 x ttl_s of wall time."""
    dilation.install(dilation.Pacer(4.0))
    try:
        a = Agent(SmartNicSettings(storage_nodes=NODES, eviction_policy="timer", ttl_s=2.5))
    finally:
        dilation.install(None)
    try:
        assert a.policy.ttl_s == 10.0 and a.dilation == 4.0
    finally:
        a.close()
    b = Agent(SmartNicSettings(storage_nodes=NODES, eviction_policy="timer", ttl_s=2.5))
    try:
        assert b.policy.ttl_s == 2.5
    finally:
        b.close()
