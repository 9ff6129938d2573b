"""Step 5: what the agent decides about a turn before it forwards it (no grpc here).

A turn is matched in the "ingress" table on (user id, context id, the sender's 5-tuple); DENY and a
rate limit past its budget refuse it; a context that belongs to another user is refused; the
table's compute node (or the one that registered a region) is the target; unless the action is
FORWARD, the context's stored chunks that cover a prefix of the turn's token ids are prefetched
into a slot that the compute node reserves (the `reserve` callback is the transport's business:
the servicer calls the compute node's ReserveSlot).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from smartnic import match_action as ma
from smartnic.registrations import Registered
from smartnic.requester import NotOwner

logger = logging.getLogger(__name__)

TCP = 6


class Refused(Exception):
    """The turn may not go on: kind is "denied" (table or owner check) or "rate_limited"."""

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


@dataclasses.dataclass(frozen=True)
class Reservation:
    """A slot the compute node reserved for the prefetch, in the region it registered."""

    slot: int
    region_id: int


@dataclasses.dataclass
class Plan:
    """Where the turn goes and what was started for it."""

    compute_address: str
    action: ma.Action
    entry_id: int | None
    restore: object = None   # agent.Restore when a prefetch was started
    decided_ns: int = 0


Reserve = Callable[[str], "Reservation | None"]  # (compute address) -> a reserved slot


def decide(agent, packet: Packet, now: float) -> tuple[ma.Decision, str, Registered | None]:
    """Match the packet and check its owner: (decision, compute address, its region); raises Refused."""
    decision = agent.match(packet.fields(), now)
    if decision.action.type == ma.DENY:
        agent.stats.inc("denied")
        raise Refused("denied", f"denied by match-action entry {decision.entry_id}")
    if decision.over_limit:
        raise Refused("rate_limited", f"rate limit of match-action entry {decision.entry_id} exceeded")
    try:
        agent.check_owner(packet.user_id, packet.context_id)
    except NotOwner as exc:
        agent.stats.inc("denied")
        raise Refused("denied", str(exc)) from exc
    address, reg = agent.compute_target(decision.action.compute_node)
    if not address:
        raise NoComputeNode("no compute node known: none registered a region with compute_address "
                            "and none is configured")
    return decision, address, reg


def plan(agent, packet: Packet, token_ids: Sequence[int], reserve: Reserve, may_prefetch: bool = True) -> Plan:
    """Step 5 for one turn: decide, then start the prefetch when the action and the requester allow."""
    decision, address, reg = decide(agent, packet, time.monotonic())
    restore = None
    if decision.action.type != ma.FORWARD and may_prefetch and reg is not None:
        restore = prefetch(agent, reg, address, packet, token_ids, reserve)
    return Plan(address, decision.action, decision.entry_id, restore, time.time_ns())


def prefetch(agent, reg: Registered, address: str, packet: Packet, token_ids: Sequence[int], reserve: Reserve):
    """Reserve a slot and queue the GETs when the requester has a matching prefix; the Restore or None."""
    if reg.layout is None:
        return None
    if not agent.matching_chunks(packet.user_id, packet.context_id, token_ids):
        return None  # not a miss yet: the compute node may still ask for a Restore
    reservation = reserve(address)
    if reservation is None:
        return None
    try:
        target = agent.registration(reservation.region_id) if reservation.region_id else reg
        restore = agent.restore(target, packet.user_id, packet.context_id, reservation.slot, list(token_ids))
    except Exception as exc:  # noqa: BLE001 - a full queue or a bad slot: the turn goes on without it
        logger.warning("prefetch into slot %d failed (%s): forwarding without it", reservation.slot, exc)
        return None
    if restore.chunks:
        agent.stats.inc("prefetches")
    return restore
