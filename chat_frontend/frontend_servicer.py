"""The ChatFrontend gRPC service: thin, translating messages and errors to ChatService calls.

The server hands each method the request's bytes (`handler()`): a request that does not parse
(a string that is not UTF-8, a truncated field, a wrong wire type) is INVALID_ARGUMENT saying so,
as is a field of the wrong size or form; a failure of the frontend itself is INTERNAL. No method
ends with UNKNOWN. SystemStats shows the storage nodes' hosts and files to an operator only
(`operators`); anyone else gets the aggregates (`system_stats.aggregates`).
"""
from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from chat_frontend import limits, sessions, system_stats
from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.replicas import Replicas
from chat_frontend.store import TurnRow
from kvtb_proto import frontend_pb2
from scale import dilation

logger = logging.getLogger(__name__)

SERVICE_NAME = frontend_pb2.DESCRIPTOR.services_by_name["ChatFrontend"].full_name
M = TypeVar("M", bound=Message)


async def _abort(context: grpc.aio.ServicerContext, error: ChatError) -> None:
    trailers = ()
    if error.retry_after_s is not None:  # as HTTP's Retry-After, for a client that backs off
        trailers = (("retry-after", str(max(1, round(error.retry_after_s)))),)
    await context.abort(getattr(grpc.StatusCode, error.code), error.message, trailing_metadata=trailers)


def parse(message_type: type[M], data: bytes) -> M:
    """The request, or INVALID_ARGUMENT saying why its bytes are not one."""
    message = message_type()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        detail = str(exc).rpartition(": ")[2] or "not valid protobuf"
        raise ChatError("INVALID_ARGUMENT", f"the request is not a valid {message_type.DESCRIPTOR.name}: "
                        f"{detail}") from None
    return message


def chat_request(request: frontend_pb2.ChatRequest, draw_seed=lambda: secrets.randbits(64)) -> frontend_pb2.ChatRequest:
    """The gRPC Chat request as the service runs it: INVALID_ARGUMENT for an empty message; a sampled
    turn (temperature > 0) without a seed (0) gets a random one, as the proto says. Greedy stays the
    default here (temperature 0), unlike the OpenAI API's 1.0."""
    limits.check_message(request.message)
    if request.sampling.temperature > 0 and request.sampling.seed == 0:
        request.sampling.seed = draw_seed()
    return request


def _internal(what: str, exc: Exception) -> ChatError:
    """A failure of the frontend itself (a bug, a broken store): logged, and said to be INTERNAL."""
    logger.exception("%s failed", what)
    return ChatError("INTERNAL", f"frontend: {type(exc).__name__}")


def _transcript_turn(turn: TurnRow) -> frontend_pb2.TranscriptTurn:
    """A stored turn; one a client resent (not served here) has no summary."""
    out = frontend_pb2.TranscriptTurn(turn=turn.turn, user_message=turn.user_message, reply=turn.reply)
    if turn.summary:
        out.summary.ParseFromString(turn.summary)
    return out


class ChatFrontendServicer:
    """The service's methods, each taking the request's bytes."""

    def __init__(self, service: ChatService, agent: Replicas):
        self.service = service
        self.agent = agent

    def handler(self) -> grpc.GenericRpcHandler:
        """The ChatFrontend service for `server.add_generic_rpc_handlers`, parsing requests itself."""
        def unary(method: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]):
            return grpc.unary_unary_rpc_method_handler(method, response_serializer=_serialize)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Chat": grpc.unary_stream_rpc_method_handler(self.Chat, response_serializer=_serialize),
            "GetContext": unary(self.GetContext), "ListContexts": unary(self.ListContexts),
            "SystemStats": unary(self.SystemStats)})

    def _metadata(self, context: grpc.aio.ServicerContext):
        return context.invocation_metadata() or ()

    async def Chat(self, data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[frontend_pb2.ChatEvent]:
        try:
            request = parse(frontend_pb2.ChatRequest, data)
            self.service.user(request.token, self._metadata(context))  # UNAUTHENTICATED before anything else
            request = chat_request(request)
            async for event in self.service.chat(request, self._metadata(context)):
                yield event
        except ChatError as exc:
            logger.info("chat refused: %s", exc)
            await _abort(context, exc)
        except Exception as exc:  # noqa: BLE001 - a bug or a broken store: say so, keep serving
            await _abort(context, _internal("chat", exc))

    async def GetContext(self, data: bytes, context: grpc.aio.ServicerContext) -> frontend_pb2.ContextResponse:
        try:
            request = parse(frontend_pb2.ContextRequest, data)
            user = self.service.user(request.token, self._metadata(context))
            if not request.context_id:
                raise ChatError("INVALID_ARGUMENT", "context_id is empty", "context_id")
            sessions.check_session_id(request.context_id, "context_id")
            ctx = self.service.context_of(user, request.context_id)
            turns = [_transcript_turn(t) for t in self.service.store.turns(user, ctx.context_id)]
            return frontend_pb2.ContextResponse(context_id=ctx.context_id, user_id=ctx.user_id,
                                                turns=turns, tokens=len(ctx.token_ids))
        except ChatError as exc:
            await _abort(context, exc)
        except Exception as exc:  # noqa: BLE001 - said to be INTERNAL, and logged
            await _abort(context, _internal("GetContext", exc))

    async def ListContexts(self, data: bytes,
                           context: grpc.aio.ServicerContext) -> frontend_pb2.ListContextsResponse:
        try:
            request = parse(frontend_pb2.ListContextsRequest, data)
            user = self.service.user(request.token, self._metadata(context))
            return frontend_pb2.ListContextsResponse(context_ids=self.service.store.list_contexts(user))
        except ChatError as exc:
            await _abort(context, exc)
        except Exception as exc:  # noqa: BLE001 - said to be INTERNAL, and logged
            await _abort(context, _internal("ListContexts", exc))

    async def SystemStats(self, data: bytes,
                          context: grpc.aio.ServicerContext) -> frontend_pb2.SystemStatsResponse:
        """Everyone's figures: in detail for an operator's token, else the aggregates only (no token,
        or a user's); an unknown token is UNAUTHENTICATED."""
        try:
            parse(frontend_pb2.SystemStatsRequest, data)
            operator = self._is_operator(self._metadata(context))
            figures = await system_stats.gather(self.frontend_figures(), self.agent,
                                                self.service.settings.storage_admin_addresses)
            if not operator:
                figures = system_stats.aggregates(figures)
            return frontend_pb2.SystemStatsResponse(json=json.dumps(figures))
        except ChatError as exc:
            await _abort(context, exc)
        except Exception as exc:  # noqa: BLE001 - said to be INTERNAL, and logged
            await _abort(context, _internal("SystemStats", exc))

    def _is_operator(self, metadata) -> bool:
        """Whether the call's bearer token is an operator's (UNAUTHENTICATED for an unknown one)."""
        try:
            user = self.service.user("", metadata)
        except ChatError:
            if not any(k.lower() == "authorization" for k, _ in metadata):
                return False  # no token: the aggregates, as `kvtb stats` asks for them
            raise
        return user in self.service.settings.operators

    def frontend_figures(self) -> dict:
        """The frontend's own counters."""
        admission = self.service.admission
        st = admission.stats
        rejected = {"waiting_room_full": st.rejected_full, "pushed_out": st.rejected_pushed,
                    "timeout": st.rejected_timeout, "quota": st.rejected_quota}
        return {"turns_completed": self.service.turns_completed,
                "turns_failed": self.service.turns_failed,
                "turns_active": admission.active, "turns_waiting": admission.waiting,
                "users_active": admission.users,
                "rejected_busy": sum(rejected.values()), "rejected_by_reason": rejected,
                "users": len(self.service.settings.users), **self.service.store.counts(),
                **pacing_of(dilation.current())}


def pacing_of(pacer) -> dict:
    """Under a hardware profile, {"pacing": the frontend's pacer's snapshot} (its software's CPU time,
    stretched by D); else nothing."""
    return {"pacing": pacer.snapshot()} if pacer is not None else {}


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()
