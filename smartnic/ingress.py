"""Step 5: what the agent decides about a turn before it forwards it (no grpc here).

A turn is matched in the "ingress" table on (user id, context id, the sender's 5-tuple); DENY and
a rate limit past its budget refuse it; the table's compute node (or the one that registered a
region) is the target; unless the action is FORWARD, the requester finds how much of the turn's
prefix is stored under the user's salt, by content, whatever context stored it (the compute node
then asks for those blocks on its stream, and the agent GETs them: step 6); blocks the agent's index
lacks are first asked of the storage nodes (`smartnic.discovery`: another replica may have stored
them). Contexts are per user,
so one user never reaches another's context or blocks; only the full blocks of the tenant's shared
prefix (shared_prefix_tokens, which the frontend sets from its operator's setting) are looked up
under the tenant's salt, and so found whichever of the tenant's users stored them.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from smartnic import match_action as ma
from smartnic.registrations import Registered

logger = logging.getLogger(__name__)

TCP = 6


class Refused(Exception):
    """The turn may not go on: kind is "denied" (the table) or "rate_limited"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class NoComputeNode(LookupError):
    """No compute node is known for the turn."""


@dataclasses.dataclass(frozen=True)
class Packet:
    """The fields a turn is matched on."""

    user_id: str
    context_id: str
    src_addr: str
    src_port: int
    dst_addr: str
    dst_port: int
    protocol: int = TCP

    def fields(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Plan:
    """Where the turn goes and how much of its prefix is stored."""

    compute_address: str
    registration: Registered | None
    action: ma.Action
    entry_id: int | None
    stored_tokens: int = 0
    decided_ns: int = 0


def decide(agent, packet: Packet, now: float) -> tuple[ma.Decision, str, Registered | None]:
    """Match the packet: (decision, compute address, its region); raises Refused or NoComputeNode."""
    decision = agent.tables.match(packet.fields(), now)
    if decision.action.type == ma.DENY:
        agent.stats.inc("denied")
        raise Refused("denied", f"denied by match-action entry {decision.entry_id}")
    if decision.over_limit:
        raise Refused("rate_limited", f"rate limit of match-action entry {decision.entry_id} exceeded")
    address, reg = agent.compute_target(decision.action.compute_node)
    if not address:
        raise NoComputeNode("no compute node known: none registered a region with compute_address "
                            "and none is configured")
    return decision, address, reg


def plan(agent, packet: Packet, tenant: str, token_ids: Sequence[int], shared_tokens: int = 0) -> Plan:
    """Step 5 for one turn: decide, then look up the stored prefix when the action allows."""
    decision, address, reg = decide(agent, packet, time.monotonic())
    stored = 0
    if decision.action.type != ma.FORWARD and reg is not None and reg.layout is not None:
        stored = agent.stored_tokens(packet.user_id, tenant, token_ids, shared_tokens)
        if stored:
            agent.stats.inc("prefetches")
    return Plan(address, reg, decision.action, decision.entry_id, stored, time.time_ns())
