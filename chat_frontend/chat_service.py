"""One chat turn from the user's request to the stored transcript, independent of transport.

The gRPC servicer and the OpenAI API call `ChatService.chat` and relay its events. A context is
its user's: the id (minted here, or chosen by the client, which starts it on first sight) names a
context of that user only. The OpenAI API also passes the history and system message a client sent.
Turns go to the SmartNIC agent in front of the compute node (`agent_client.AgentClient`, the
`Agent` protocol below); tests pass a fake with the same methods.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import AsyncIterator, Iterable, Protocol

from chat_frontend import conversation, limits, prompt, sessions
from chat_frontend.admission import Admission, estimate_tokens
from chat_frontend.auth import Authenticator, token_from
from chat_frontend.conversation import History
from chat_frontend.errors import ChatError
from chat_frontend.metrics import Tenants, TurnTimer
from chat_frontend.record import TurnClock, build_summary
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import Context, SessionStore, TurnRow
from kvtb.logs import request_id as log_request_id
from kvtb_proto import compute_pb2, frontend_pb2

logger = logging.getLogger(__name__)


class Agent(Protocol):
    """What the frontend needs of the agent (which serves the compute node's service)."""

    async def info(self) -> compute_pb2.InfoResponse: ...
    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]: ...
    def generate(self, request: compute_pb2.TurnRequest) -> AsyncIterator[compute_pb2.TurnEvent]: ...


class ChatService:
    """Authenticates, checks limits, runs turns through the agent and keeps transcripts."""

    def __init__(self, settings: FrontendSettings, store: SessionStore, agent: Agent):
        self.settings = settings
        self.store = store
        self.agent = agent
        self.auth = Authenticator(settings.users)
        self.admission = Admission(settings.max_concurrent_turns, settings.max_waiting_turns,
                                   settings.queue_timeout_s, settings.limits_of)
        self.tenants = Tenants()
        self.shared_prefix = prompt.SharedPrefix(agent, settings.shared_system_prompts)
        self.turns_completed = 0
        self.turns_failed = 0

    def user(self, token: str, metadata: Iterable[tuple[str, str]] = ()) -> str:
        """The authenticated user, or UNAUTHENTICATED."""
        return self.auth.user_for(token_from(token, metadata))

    def context_of(self, user: str, context_id: str) -> Context:
        """The user's context, or NOT_FOUND (another user's context of that id is never seen)."""
        ctx = self.store.get_context(user, context_id)
        if ctx is None:
            raise ChatError("NOT_FOUND", f"unknown context {context_id!r}")
        return ctx

    async def chat(self, request: frontend_pb2.ChatRequest, metadata: Iterable[tuple[str, str]] = (),
                   history: History = (), system: str | None = None) -> AsyncIterator[frontend_pb2.ChatEvent]:
        """Run one turn: yields the context id, text deltas, then the turn's summary.

        history: the (role, content) messages a client resent before this one; system: its system
        message (None: the configured one applies to a new context).
        """
        clock = TurnClock(start_ns=time.time_ns())
        user = self.user(request.token, metadata)
        tenant = self.settings.tenant_of(user)  # metrics name tenants, never users
        try:
            async with contextlib.aclosing(self._admitted(user, request, history, system, clock)) as events:
                async for event in events:  # closed at once when the user goes away
                    yield event
        except ChatError as exc:
            self.tenants.failed(tenant, exc.code)
            raise
        except (GeneratorExit, asyncio.CancelledError):  # the user went away
            self.tenants.failed(tenant, "CANCELLED")
            raise
        except BaseException:
            self.tenants.failed(tenant, "INTERNAL")
            raise

    async def _admitted(self, user: str, request: frontend_pb2.ChatRequest, history: History,
                        system: str | None, clock: TurnClock) -> AsyncIterator[frontend_pb2.ChatEvent]:
        """Check the request's limits and context, wait for admission (the user's fair share), run the turn."""
        limits.check_message(request.message, self.settings.message_max_chars)
        limits.check_sampling(request.sampling.temperature, request.sampling.top_p)
        max_new = limits.resolve_max_new_tokens(request.max_new_tokens,
                                                self.settings.max_new_tokens_default,
                                                self.settings.max_new_tokens_cap)
        if request.context_id:
            context_id = sessions.check_session_id(request.context_id, "context_id")
        else:
            context_id = sessions.new_context_id()
        prompt_tokens = estimate_tokens(request.message, system or "", *(text for _, text in history))
        async with self.admission.turn(user, (user, context_id), prompt_tokens):
            try:
                async for event in self._turn(user, context_id, request, history, system, max_new, clock):
                    yield event
            except BaseException:
                self.turns_failed += 1
                raise

    async def _turn(self, user: str, context_id: str, request: frontend_pb2.ChatRequest, history: History,
                    system: str | None, max_new: int,
                    clock: TurnClock) -> AsyncIterator[frontend_pb2.ChatEvent]:
        ctx = self.store.get_context(user, context_id)  # now: an earlier turn may have just ended
        stored = self.store.turns(user, context_id) if ctx is not None and history else []
        source = None
        if ctx is None and history:  # a conversation this frontend served the user, resent?
            source = self.store.find_transcript(
                user, conversation.effective_system(system, self.settings.system_prompt),
                conversation.turn_pairs(history))
        info = await self.agent.info()
        plan = await prompt.build(self.agent, self.settings.system_prompt, ctx, stored, request.message,
                                  history, system, source)
        room = info.max_context_tokens - len(plan.kept_ids) - len(plan.new_ids)
        max_new = limits.fit_default(max_new, request.max_new_tokens, room)
        limits.check_context_fits(len(plan.kept_ids), len(plan.new_ids), max_new, info.max_context_tokens)
        tenant = self.settings.tenant_of(user)
        token_ids = plan.token_ids
        shared = await self.shared_prefix.tokens(tenant, info.model, token_ids)
        request_id = uuid.uuid4().hex
        log_request_id.set(request_id)  # this task serves this turn only
        timer = TurnTimer(tenant, clock.start_ns)
        turn_request = compute_pb2.TurnRequest(
            request_id=request_id, user_id=user, context_id=context_id, tenant=tenant, token_ids=token_ids,
            max_new_tokens=max_new, sampling=request.sampling, shared_prefix_tokens=shared)
        turn_no = (ctx.turns if ctx else len(plan.resent)) + 1
        logger.info("turn %s: user %s context %s turn %d, %d tokens (%d turns resent%s, %d shared)",
                    request_id, user, context_id, turn_no, len(token_ids), len(plan.resent),
                    f" as in {source[0].context_id}" if source else "", shared)
        yield frontend_pb2.ChatEvent(context_id=context_id)
        texts: list[str] = []
        out_ids: list[int] = []
        record = None
        async for event in self.agent.generate(turn_request):
            if event.HasField("token"):
                out_ids.append(event.token.id)
                if event.token.text:
                    now_ns = time.time_ns()
                    clock.first_text_ns = clock.first_text_ns or now_ns
                    timer.text(now_ns)
                    texts.append(event.token.text)
                    yield frontend_pb2.ChatEvent(text=event.token.text)
            elif event.HasField("record"):
                record = event.record
        if record is None:
            raise ChatError("UNAVAILABLE", "the agent ended the turn without its record")
        reply = "".join(texts)
        reply_ids = list(record.output_token_ids) or out_ids
        clock.end_ns = time.time_ns()
        finish = record.finish_reason or (
            "stop" if reply_ids and reply_ids[-1] in info.stop_token_ids else "length")
        summary = build_summary(turn_no, context_id, request_id, reply, record, clock, finish)
        row = TurnRow(turn_no, request.message, reply, plan.new_ids, tuple(reply_ids),
                      summary.SerializeToString())
        kept = [*token_ids, *conversation.closed_reply(reply_ids, info.stop_token_ids)]
        # off the event loop: the commit waits for fsync
        await asyncio.to_thread(self.store.add_turns, user, context_id, [*plan.resent, row], kept,
                                time.time(), plan.system)
        self.turns_completed += 1
        timer.done(clock.end_ns)
        self.tenants.finished(tenant, summary)
        logger.info("turn %s done: kv_source %s, %d tokens out, e2e %.1f ms, gateway %.1f ms",
                    request_id, summary.kv_source, summary.tokens_out, summary.e2e_ms,
                    summary.gateway_ms,
                    extra={"event": "turn", "user_id": user, "context_id": context_id,
                           "kv_source": summary.kv_source, "duration_ms": summary.e2e_ms,
                           "bytes": summary.bytes_restored})
        yield frontend_pb2.ChatEvent(summary=summary)
