"""The whole system's figures: the frontend's own, the agent's, the compute node's, each storage node's.

`gather` collects them in detail (for an operator); `aggregates` keeps what any user may see:
counts and sizes, never a host's NQN, a backing file's path or an error's details. With one
replica, "agent" and "compute" are its agent's and compute node's; with several, "replicas" maps
each replica's name to its own ("up", "address", "agent", "compute") and "compute" adds up the
compute nodes that answered.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from chat_frontend.replicas import Replica, Replicas, sum_stats
from kvtb.rpc import Security, aio_channel
from kvtb_proto import compute_pb2, storage_admin_pb2, storage_admin_pb2_grpc

logger = logging.getLogger(__name__)


async def _figures(what: str, call: Awaitable) -> dict[str, Any]:
    """The reply as a dict, or {"error": ...} when the service did not answer."""
    try:
        reply = await call
    except grpc.aio.AioRpcError as exc:
        logger.info("stats of %s failed: %s", what, exc.details())
        return {"error": f"{exc.code().name}: {exc.details()}"}
    return _as_dict(reply)


def _as_dict(reply) -> dict[str, Any]:
    return MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True,
                         unquote_int64_if_possible=True)


async def replica_figures(replica: Replica) -> tuple[dict[str, Any], dict[str, Any],
                                                     compute_pb2.ComputeStatsResponse | None]:
    """(its agent's figures, its compute node's, the compute node's reply or None)."""
    compute_reply: list = []

    async def compute():
        reply = await replica.client.compute_stats()
        compute_reply.append(reply)
        return reply

    agent_figs, compute_figs = await asyncio.gather(
        _figures(f"{replica.name}'s agent", replica.client.agent_stats()),
        _figures(f"{replica.name}'s compute node", compute()))
    return ({"address": replica.client.address, **agent_figs}, compute_figs,
            compute_reply[0] if compute_reply else None)


async def storage_figures(address: str, security: Security, timeout_s: float = 5.0) -> dict[str, Any]:
    """One storage node's StorageAdmin.Stats."""
    async with aio_channel(address, security, peer="storage") as channel:
        stub = storage_admin_pb2_grpc.StorageAdminStub(channel)
        figures = await _figures(f"storage {address}",
                                 stub.Stats(storage_admin_pb2.StatsRequest(), timeout=timeout_s))
    return {"address": address, **figures}


async def gather(frontend: dict[str, Any], replicas: Replicas,
                 storage_addresses: tuple[str, ...]) -> dict[str, Any]:
    """Everyone's figures at once, as one JSON-ready dict."""
    members = replicas.replicas
    figures = await asyncio.gather(*(replica_figures(r) for r in members),
                                   *(storage_figures(a, replicas.security) for a in storage_addresses))
    per_replica, storage = figures[:len(members)], list(figures[len(members):])
    if len(members) == 1:
        agent_figs, compute_figs, _ = per_replica[0]
        return {"frontend": frontend, "agent": agent_figs, "compute": compute_figs, "storage": storage}
    answered = [reply for _, _, reply in per_replica if reply is not None]
    compute = ({**_as_dict(sum_stats(answered)), "replicas_answered": len(answered)} if answered
               else {"error": "UNAVAILABLE: no compute node answered"})
    return {"frontend": frontend, "compute": compute, "storage": storage,
            "replicas": {r.name: {"up": r.up, "address": r.client.address, "agent": agent_figs,
                                  "compute": compute_figs}
                         for r, (agent_figs, compute_figs, _) in zip(members, per_replica)}}


# maps whose keys are hosts' NQNs: left out of the aggregates (storage nodes' configured names,
# as in the agent's bytes_by_storage_node, stay: `kvtb stats` shows the bytes on each)
NAMED_BY_HOST = ("queue_depth_by_host",)
# text fields the aggregates keep (kinds and names of the system's own, never of a host or a file)
PUBLIC_TEXT = ("address", "command_set", "opcode", "status")
AGGREGATES_NOTE = "aggregates only: the detail (hosts, files) is for an operator's token"


def aggregates(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures without hosts' NQNs, files' paths or errors' details: numbers, maps of kinds (and
    storage nodes' names) to numbers, the services' addresses, and an error's status code only."""
    out = {key: _public(value) for key, value in figures.items()}
    out["detail"] = AGGREGATES_NOTE
    return out


def _public(value: Any) -> Any:
    if isinstance(value, list):
        return [_public(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in NAMED_BY_HOST:
            continue
        if key == "error" and isinstance(item, str):
            out[key] = item.split(":", 1)[0]  # the status code; its details may name files or hosts
        elif key == "offline_namespaces" and isinstance(item, dict):
            out[key] = {nsid: "offline" for nsid in item}  # why (a damaged file) is the operator's
        elif isinstance(item, str):
            if key in PUBLIC_TEXT:
                out[key] = item
        else:
            out[key] = _public(item)
    return out
