"""The frontend's link to the SmartNIC agent, which serves the ComputeNode service.

Every turn goes to the agent (it matches the request, may prefetch the context's KV, and
forwards to the compute node). gRPC errors become ChatErrors with the agent's status, naming
the service that failed: an UNAVAILABLE the agent marks with `kvtb-failed-service` (its compute
node cannot be reached) keeps the agent's message, which names that service; any other
UNAVAILABLE means the agent itself cannot be reached. A compute node's refusal of a prompt past
the model's context (vLLM's words) keeps OpenAI's code for it, context_length_exceeded.
"""
from __future__ import annotations

import logging
from typing import AsyncIterator

import grpc

from chat_frontend import limits
from chat_frontend.errors import CODES, ChatError
from kvtb.rpc import Security, aio_channel
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc

logger = logging.getLogger(__name__)


FAILED_SERVICE_KEY = "kvtb-failed-service"  # smartnic.compute_proxy.FAILED_SERVICE


def chat_error(exc: grpc.aio.AioRpcError, address: str) -> ChatError:
    """The ChatError to report for an error from the agent."""
    code = exc.code().name if exc.code() else "INTERNAL"
    failed = dict(exc.trailing_metadata() or ()).get(FAILED_SERVICE_KEY)
    if code == "UNAVAILABLE" and failed:
        return ChatError("UNAVAILABLE", f"{exc.details()} (the agent at {address} answered)")
    if code == "UNAVAILABLE":
        return ChatError("UNAVAILABLE", f"the agent at {address} cannot be reached: {exc.details()}")
    if code == "INVALID_ARGUMENT" and limits.CONTEXT_EXCEEDED_WORDS in (exc.details() or ""):
        return ChatError(code, f"agent: {exc.details()}", openai_code=limits.CONTEXT_LENGTH_EXCEEDED)
    return ChatError(code if code in CODES else "INTERNAL", f"agent: {exc.details()}")


class AgentClient:
    """Async client of the agent's ComputeNode proxy and SmartNic stats. One event loop."""

    def __init__(self, address: str, security: Security, turn_timeout_s: float = 300.0,
                 peer: str = "smartnic"):
        self.address = address
        self.security = security
        self.turn_timeout_s = turn_timeout_s
        self.peer = peer  # the agent's identity (replica i >= 1: smartnic-i)
        self._channel = aio_channel(address, security, peer=peer)
        self._compute = compute_pb2_grpc.ComputeNodeStub(self._channel)
        self._smartnic = smartnic_pb2_grpc.SmartNicStub(self._channel)
        self._info: compute_pb2.InfoResponse | None = None

    @property
    def model(self) -> str:
        """The model's name once Info answered, else ''."""
        return self._info.model if self._info else ""

    async def close(self) -> None:
        await self._channel.close()

    async def info(self, timeout_s: float = 10.0) -> compute_pb2.InfoResponse:
        """The model's facts (cached after the first answer)."""
        if self._info is None:
            try:
                self._info = await self._compute.Info(compute_pb2.InfoRequest(), timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise chat_error(exc, self.address) from None
        return self._info

    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]:
        """Token ids of the messages under the model's chat template."""
        try:
            reply = await self._compute.EncodeChat(request, timeout=30.0)
        except grpc.aio.AioRpcError as exc:
            raise chat_error(exc, self.address) from None
        return list(reply.token_ids)

    async def decode(self, token_ids: list[int]) -> str:
        """The text of token ids (the compute node's tokenizer)."""
        try:
            reply = await self._compute.Decode(compute_pb2.DecodeRequest(token_ids=token_ids), timeout=30.0)
        except grpc.aio.AioRpcError as exc:
            raise chat_error(exc, self.address) from None
        return reply.text

    async def generate(self, request: compute_pb2.TurnRequest, route=None) -> AsyncIterator[compute_pb2.TurnEvent]:
        """The turn's token events, then its record (route: the Agent protocol's; one agent leaves it as is)."""
        call = self._compute.Generate(request, timeout=self.turn_timeout_s)
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as exc:
            raise chat_error(exc, self.address) from None
        finally:
            call.cancel()  # no-op once the call finished; stops the turn if the user went away

    async def compute_stats(self, timeout_s: float = 5.0) -> compute_pb2.ComputeStatsResponse:
        return await self._compute.Stats(compute_pb2.ComputeStatsRequest(), timeout=timeout_s)

    async def agent_stats(self, timeout_s: float = 5.0) -> smartnic_pb2.StatsResponse:
        return await self._smartnic.Stats(smartnic_pb2.StatsRequest(), timeout=timeout_s)
