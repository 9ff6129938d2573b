"""The whole system's figures: the frontend's own, the agent's, the compute node's, each storage node's.

`gather` collects them in detail (for an operator); `aggregates` keeps what any user may see:
counts and sizes, never a host's NQN, a backing file's path or an error's details.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from chat_frontend.agent_client import AgentClient
from kvtb.rpc import Security, aio_channel
from kvtb_proto import storage_admin_pb2, storage_admin_pb2_grpc

logger = logging.getLogger(__name__)


async def _figures(what: str, call: Awaitable) -> dict[str, Any]:
    """The reply as a dict, or {"error": ...} when the service did not answer."""
    try:
        reply = await call
    except grpc.aio.AioRpcError as exc:
        logger.info("stats of %s failed: %s", what, exc.details())
        return {"error": f"{exc.code().name}: {exc.details()}"}
    return MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True,
                         unquote_int64_if_possible=True)


async def storage_figures(address: str, security: Security, timeout_s: float = 5.0) -> dict[str, Any]:
    """One storage node's StorageAdmin.Stats."""
    async with aio_channel(address, security, peer="storage") as channel:
        stub = storage_admin_pb2_grpc.StorageAdminStub(channel)
        figures = await _figures(f"storage {address}",
                                 stub.Stats(storage_admin_pb2.StatsRequest(), timeout=timeout_s))
    return {"address": address, **figures}


async def gather(frontend: dict[str, Any], agent: AgentClient,
                 storage_addresses: tuple[str, ...]) -> dict[str, Any]:
    """Everyone's figures at once, as one JSON-ready dict."""
    agent_figs, compute_figs, *storage = await asyncio.gather(
        _figures("agent", agent.agent_stats()),
        _figures("compute", agent.compute_stats()),
        *(storage_figures(a, agent.security) for a in storage_addresses))
    return {"frontend": frontend, "agent": {"address": agent.address, **agent_figs},
            "compute": compute_figs, "storage": storage}


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
