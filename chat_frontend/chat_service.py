"""One chat turn from the user's request to the stored transcript, independent of transport.

The gRPC servicer and the OpenAI API call `ChatService.chat` and relay its events. A context is
its user's: the id (minted here, or chosen by the client, which starts it on first sight) names a
context of that user only. The OpenAI API also passes the history and system message a client sent.
Turns go to the replicas (SmartNIC agents, each in front of its compute node: `replicas.Replicas`,
the `Agent` protocol below), which name the replica that served each turn; tests pass a fake with
the same methods.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from typing import AsyncIterator, Iterable, Protocol

from chat_frontend import conversation, limits, prompt, sessions
from chat_frontend.admission import Admission, estimate_tokens
from chat_frontend.auth import Authenticator, token_from
from chat_frontend.conversation import History, Whole
from chat_frontend.errors import ChatError
from chat_frontend.metrics import Tenants, TurnTimer
from chat_frontend.record import TurnClock, build_summary
from chat_frontend.routing import Route
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import Context, SessionStore, TurnRow
from chat_frontend.vllm_metrics import FinishCounts
from kvtb.logs import request_id as log_request_id
from kvtb_proto import compute_pb2, frontend_pb2

logger = logging.getLogger(__name__)


class Agent(Protocol):
    """What the frontend needs of the agent (which serves the compute node's service)."""

    async def info(self) -> compute_pb2.InfoResponse: ...
    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]: ...
    async def decode(self, token_ids: list[int]) -> str: ...
    def generate(self, request: compute_pb2.TurnRequest,
                 route: Route | None = None) -> AsyncIterator[compute_pb2.TurnEvent]: ...


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
        self.finishes = FinishCounts()  # choices by finish reason (vllm:request_success_total), chat and completions
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
                   history: History = (), system: str | None = None, *, whole: Whole | None = None,
                   ignore_eos: bool = False, max_tokens_param: str = "max_new_tokens",
                   default_max_tokens: int | None = None) -> AsyncIterator[frontend_pb2.ChatEvent]:
        """Run one turn: yields the context id, text deltas (with their tokens, per choice), then each
        choice's summary (in choice order, once the transcript is stored).

        history: the (role, content) messages a client resent before this one; system: its system
        message (None: the configured one applies to a new context); whole: messages the template
        renders whole instead (request.message is then unused); max_tokens_param: the request field
        that gave request.max_new_tokens, named when it does not fit the context; default_max_tokens:
        the reply's length when request.max_new_tokens is 0 (None: the gRPC Chat API's,
        `chat_max_new_tokens`; 0: vLLM's, what the context leaves), never past what the context leaves.
        """
        clock = TurnClock(start_ns=time.time_ns())
        user = self.user(request.token, metadata)
        tenant = self.settings.tenant_of(user)  # metrics name tenants, never users
        default = self.settings.chat_max_new_tokens if default_max_tokens is None else default_max_tokens
        turn = _Turn(request, history, system, whole, ignore_eos, max_tokens_param, default)
        try:
            async with contextlib.aclosing(self._admitted(user, turn, clock)) as events:
                async for event in events:  # closed at once when the user goes away
                    yield event
        except ChatError as exc:
            self.tenants.failed(tenant, exc.code)
            raise
        except (GeneratorExit, asyncio.CancelledError):  # the user went away
            self.tenants.failed(tenant, "CANCELLED")
            self.finishes.finished("abort", max(1, request.n))
            raise
        except BaseException:
            self.tenants.failed(tenant, "INTERNAL")
            raise

    async def _admitted(self, user: str, turn: _Turn, clock: TurnClock) -> AsyncIterator[frontend_pb2.ChatEvent]:
        """Check the request's limits and context, wait for admission (the user's fair share), run the turn.

        n choices hold one place (they are one turn of one context) but count n times the prompt's
        tokens against the user's share of queued prompt tokens: the compute node runs n sequences.
        """
        request = turn.request
        limits.check_sampling(request.sampling.temperature, request.sampling.top_p)
        n = limits.check_n(request.n, self.settings.max_n)
        if request.context_id:
            context_id = sessions.check_session_id(request.context_id, "context_id")
        else:
            context_id = sessions.new_context_id()
        if turn.whole is not None:
            texts = [content for _, content in turn.whole.messages]
        else:
            texts = [request.message, turn.system or "", *(text for _, text in turn.history)]
        prompt_tokens = estimate_tokens(*texts) * n
        queued_ns = time.time_ns()
        async with self.admission.turn(user, (user, context_id), prompt_tokens):
            clock.wait_ns = time.time_ns() - queued_ns
            try:
                async for event in self._turn(user, context_id, turn, n, clock):
                    yield event
            except BaseException:
                self.turns_failed += 1
                raise

    async def _plan(self, user: str, context_id: str, turn: _Turn) -> tuple[Context | None, prompt.Prompt, object]:
        """(the stored context or None, the turn's prompt, the context its resent history was served in)."""
        ctx = self.store.get_context(user, context_id)  # now: an earlier turn may have just ended
        if turn.whole is not None:
            return ctx, await prompt.build_whole(self.agent, self.settings.system_prompt, ctx, turn.whole), None
        history, system = turn.history, turn.system
        stored = self.store.turns(user, context_id) if ctx is not None and history else []
        source = None
        if ctx is None and history:  # a conversation this frontend served the user, resent?
            source = self.store.find_transcript(
                user, conversation.effective_system(system, self.settings.system_prompt),
                conversation.turn_pairs(history))
        plan = await prompt.build(self.agent, self.settings.system_prompt, ctx, stored, turn.request.message,
                                  history, system, source)
        return ctx, plan, source

    async def _turn(self, user: str, context_id: str, turn: _Turn, n: int,
                    clock: TurnClock) -> AsyncIterator[frontend_pb2.ChatEvent]:
        request = turn.request
        ctx, plan, source = await self._plan(user, context_id, turn)
        info = await self.agent.info()
        settings = self.settings  # max_new_tokens 0: what the context leaves; the settings may lower it
        prompt_tokens = len(plan.kept_ids) + len(plan.new_ids)
        default = min((d for d in (settings.max_new_tokens_default, turn.default_max_tokens) if d), default=0)
        max_new = limits.max_new_tokens(
            prompt_tokens, limits.context_tokens(info), request.max_new_tokens or None,
            default=default, cap=settings.max_new_tokens_cap,
            tokens_param=turn.max_tokens_param)
        tenant = self.settings.tenant_of(user)
        token_ids = plan.token_ids
        shared = await self.shared_prefix.tokens(tenant, info.model, token_ids)
        request_id = uuid.uuid4().hex
        log_request_id.set(request_id)  # this task serves this turn only
        timer = TurnTimer(tenant, clock.start_ns, clock.wait_ns / 1e9)
        choices = []
        for i in range(n):  # the same prompt, prefilled once: the others find its blocks (merged)
            sampling = compute_pb2.Sampling()
            sampling.CopyFrom(request.sampling)
            sampling.seed = (sampling.seed + i) % (1 << 64)
            choices.append(_Choice(i, compute_pb2.TurnRequest(
                request_id=request_id if i == 0 else f"{request_id}-{i}", user_id=user, context_id=context_id,
                tenant=tenant, token_ids=token_ids, max_new_tokens=max_new, sampling=sampling,
                shared_prefix_tokens=shared, ignore_eos=turn.ignore_eos)))
        for follower in choices[1:]:  # to the first's replica: the prompt is prefilled once
            follower.route.follow = choices[0].route
        turn_no = (ctx.turns if ctx else len(plan.resent)) + 1
        logger.info("turn %s: user %s context %s turn %d, %d tokens (%d turns resent%s, %d shared), %d choices",
                    request_id, user, context_id, turn_no, len(token_ids), len(plan.resent),
                    f" as in {source[0].context_id}" if source else "", shared, n)
        yield frontend_pb2.ChatEvent(context_id=context_id)
        async for event in merged([c.events(self.agent, clock, timer) for c in choices], n):
            yield event
        clock.end_ns = time.time_ns()
        summaries = [c.summary(turn_no, context_id, clock, info.stop_token_ids) for c in choices]
        first = choices[0]
        user_message = turn.whole.user_message if turn.whole is not None else request.message
        row = TurnRow(turn_no, user_message, first.reply, plan.new_ids, tuple(first.reply_ids),
                      summaries[0].SerializeToString())
        kept = [*token_ids, *conversation.closed_reply(first.reply_ids, info.stop_token_ids)]
        # off the event loop: the commit waits for fsync
        await asyncio.to_thread(self.store.add_turns, user, context_id, [*plan.resent, row], kept,
                                time.time(), plan.system)
        self.turns_completed += 1
        timer.done(clock.end_ns)
        for c in choices:
            timer.request_done(len(token_ids), c.record)
        counted = frontend_pb2.TurnSummary()
        counted.CopyFrom(summaries[0])
        counted.tokens_out = sum(s.tokens_out for s in summaries)
        self.tenants.finished(tenant, counted)
        for s in summaries:
            self.finishes.finished(s.finish_reason or "stop")
        summary = summaries[0]
        logger.info("turn %s done on %s%s: kv_source %s (%s), %d tokens out, e2e %.1f ms, gateway %.1f ms",
                    request_id, summary.replica or "the agent",
                    f" (retried from {summary.retried_from})" if summary.retried_from else "",
                    summary.kv_source, summary.kv_origin, counted.tokens_out, summary.e2e_ms,
                    summary.gateway_ms,
                    extra={"event": "turn", "user_id": user, "context_id": context_id,
                           "kv_source": summary.kv_source, "duration_ms": summary.e2e_ms,
                           "bytes": summary.bytes_restored, "replica": summary.replica})
        for i, summary in enumerate(summaries):
            yield frontend_pb2.ChatEvent(summary=summary, choice=i)


@dataclasses.dataclass(frozen=True)
class _Turn:
    """What a chat call asks: the request, and what the OpenAI API adds to it."""

    request: frontend_pb2.ChatRequest
    history: History = ()
    system: str | None = None
    whole: Whole | None = None
    ignore_eos: bool = False
    max_tokens_param: str = "max_new_tokens"  # the field that gave request.max_new_tokens (HTTP: max_tokens)
    default_max_tokens: int = 0  # the reply's length when the request gives none (0: what the context leaves)


class _Choice:
    """One of a turn's n generate streams: its events, and what it leaves (reply, ids, record)."""

    def __init__(self, index: int, request: compute_pb2.TurnRequest):
        self.index = index
        self.request = request
        self.texts: list[str] = []
        self.out_ids: list[int] = []
        self.record: compute_pb2.TurnRecord | None = None
        self.route = Route()  # the replica that served it (and one that failed before)

    async def events(self, agent: Agent, clock: TurnClock,
                     timer: TurnTimer | None) -> AsyncIterator[frontend_pb2.ChatEvent]:
        """Text events, each with the tokens whose text it is (a token that added no text rides on the
        next one; with logprobs, the last such tokens on an empty text event at the end). The timer
        observes every choice's tokens, and the first choice's text as the turn's."""
        pending: list[compute_pb2.TurnEvent.Token] = []
        async for event in agent.generate(self.request, self.route):
            if event.HasField("token"):
                now_ns = time.time_ns()
                if timer is not None:
                    timer.token(self.index, now_ns)
                self.out_ids.append(event.token.id)
                pending.append(event.token)
                if event.token.text:
                    clock.first_text_ns = clock.first_text_ns or now_ns
                    if timer is not None and self.index == 0:
                        timer.text(now_ns)
                    self.texts.append(event.token.text)
                    yield frontend_pb2.ChatEvent(text=event.token.text, tokens=pending, choice=self.index)
                    pending = []
            elif event.HasField("record"):
                self.record = event.record
        if self.record is None:
            raise ChatError("UNAVAILABLE", "the agent ended the turn without its record")
        if pending and self.request.sampling.logprobs:  # only their logprobs have anything to say
            yield frontend_pb2.ChatEvent(text="", tokens=pending, choice=self.index)

    @property
    def reply(self) -> str:
        return "".join(self.texts)

    @property
    def reply_ids(self) -> list[int]:
        return list(self.record.output_token_ids) or self.out_ids

    def summary(self, turn_no: int, context_id: str, clock: TurnClock, stop_ids) -> frontend_pb2.TurnSummary:
        ids = self.reply_ids
        finish = self.record.finish_reason or ("stop" if ids and ids[-1] in stop_ids else "length")
        if not self.record.replica and self.route.replica:
            self.record.replica = self.route.replica
        return build_summary(turn_no, context_id, self.request.request_id, self.reply, self.record, clock,
                             finish, choice=self.index, retried_from=self.route.retried_from)


_DONE = object()


async def merged(streams: list, n: int = 1) -> AsyncIterator:
    """The events of several async iterators as they come (one: itself, no task); the first error
    ends all of them.

    n > 1: the streams are groups of n choices of one prompt each (consecutive); in each group the
    first starts at once and the other n - 1 once it gave its first event (its first token: the
    prompt is prefilled), so that they find the prompt's full blocks in the compute node's prefix
    cache instead of each prefilling it again (vLLM prefills a prompt once for its n choices).
    """
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as events:
            async for event in events:
                yield event
        return
    queue: asyncio.Queue = asyncio.Queue()
    tasks: list[asyncio.Task] = []
    closing = False

    def start(group: list) -> None:
        if not closing:  # never a new turn once the consumer stopped
            tasks.extend(asyncio.create_task(pump(stream)) for stream in group)

    async def pump(stream, followers: list = ()) -> None:
        try:
            async with contextlib.aclosing(stream) as events:
                async for event in events:
                    queue.put_nowait(event)
                    if followers:
                        start(followers)
                        followers = ()
            queue.put_nowait(_DONE)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait(exc)
        finally:
            if followers:  # ended (or failed) before its first event: the others start anyway
                start(followers)

    size = max(1, n)
    for g in range(0, len(streams), size):
        tasks.append(asyncio.create_task(pump(streams[g], streams[g + 1:g + size])))
    try:
        done = 0
        while done < len(streams):
            item = await queue.get()
            if item is _DONE:
                done += 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        closing = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:  # followers never started: close them (never iterated)
            await stream.aclose()
