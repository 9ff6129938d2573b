"""The ChatFrontend gRPC servicer: thin, translating messages and errors to ChatService calls."""
from __future__ import annotations

import json
import logging
from typing import AsyncIterator

import grpc

from chat_frontend import system_stats
from chat_frontend.agent_client import AgentClient
from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.store import TurnRow
from kvtb_proto import frontend_pb2, frontend_pb2_grpc

logger = logging.getLogger(__name__)


async def _abort(context: grpc.aio.ServicerContext, error: ChatError) -> None:
    await context.abort(getattr(grpc.StatusCode, error.code), error.message)


def _transcript_turn(turn: TurnRow) -> frontend_pb2.TranscriptTurn:
    """A stored turn; one a client resent (not served here) has no summary."""
    out = frontend_pb2.TranscriptTurn(turn=turn.turn, user_message=turn.user_message, reply=turn.reply)
    if turn.summary:
        out.summary.ParseFromString(turn.summary)
    return out


class ChatFrontendServicer(frontend_pb2_grpc.ChatFrontendServicer):
    def __init__(self, service: ChatService, agent: AgentClient):
        self.service = service
        self.agent = agent

    async def Chat(self, request: frontend_pb2.ChatRequest,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[frontend_pb2.ChatEvent]:
        try:
            async for event in self.service.chat(request, context.invocation_metadata() or ()):
                yield event
        except ChatError as exc:
            logger.info("chat refused: %s", exc)
            await _abort(context, exc)
        except Exception as exc:  # a bug or a broken store: say so, keep serving
            logger.exception("chat failed")
            await _abort(context, ChatError("INTERNAL", f"frontend: {type(exc).__name__}: {exc}"))

    async def GetContext(self, request: frontend_pb2.ContextRequest,
                         context: grpc.aio.ServicerContext) -> frontend_pb2.ContextResponse:
        try:
            user = self.service.user(request.token, context.invocation_metadata() or ())
            ctx = self.service.context_of(user, request.context_id)
        except ChatError as exc:
            await _abort(context, exc)
        turns = [_transcript_turn(t) for t in self.service.store.turns(user, ctx.context_id)]
        return frontend_pb2.ContextResponse(context_id=ctx.context_id, user_id=ctx.user_id,
                                            turns=turns, tokens=len(ctx.token_ids))

    async def ListContexts(self, request: frontend_pb2.ListContextsRequest,
                           context: grpc.aio.ServicerContext) -> frontend_pb2.ListContextsResponse:
        try:
            user = self.service.user(request.token, context.invocation_metadata() or ())
        except ChatError as exc:
            await _abort(context, exc)
        return frontend_pb2.ListContextsResponse(context_ids=self.service.store.list_contexts(user))

    async def SystemStats(self, request: frontend_pb2.SystemStatsRequest,
                          context: grpc.aio.ServicerContext) -> frontend_pb2.SystemStatsResponse:
        figures = await system_stats.gather(self.frontend_figures(), self.agent,
                                            self.service.settings.storage_admin_addresses)
        return frontend_pb2.SystemStatsResponse(json=json.dumps(figures))

    def frontend_figures(self) -> dict:
        """The frontend's own counters."""
        admission = self.service.admission
        return {"turns_completed": self.service.turns_completed,
                "turns_failed": self.service.turns_failed,
                "turns_active": admission.active, "turns_waiting": admission.waiting,
                "rejected_busy": admission.stats.rejected_full + admission.stats.rejected_timeout,
                "users": len(self.service.settings.users), **self.service.store.counts()}
