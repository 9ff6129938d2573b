"""The whole system's figures: the frontend's own, the agent's, the compute node's, each storage node's."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable

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
