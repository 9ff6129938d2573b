"""Completions' turns: raw token ids (no chat template, no transcript) through the agent.

A request's prompts are tokenized as text (the tokenizer's special tokens as asked) or taken as
token ids, checked against the model's context (`fit_tokens`, as vLLM checks), then run as one
admitted turn of the user (the user's fair share, as chat turns; its prompt tokens counted n times
per prompt) under a fresh context id: each prompt's n choices are TurnRequests of that context,
which the agent matches against the user's stored KV by content, as it does a chat turn's. The
frontend's metrics (per tenant, never per user) count the request as a turn.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from chat_frontend import limits, sessions
from chat_frontend.chat_service import ChatService, merged
from chat_frontend.completions_format import CompletionsRequest
from chat_frontend.errors import ChatError
from chat_frontend.metrics import TurnTimer
from chat_frontend.routing import Route
from chat_frontend.vllm_metrics import FinishCounts
from kvtb.logs import request_id as log_request_id
from kvtb_proto import compute_pb2, frontend_pb2

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Token:
    """A generated token of choice `index`."""

    index: int
    token: compute_pb2.TurnEvent.Token


@dataclasses.dataclass(frozen=True)
class Finished:
    """Choice `index` ended: the engine's record of it."""

    index: int
    record: compute_pb2.TurnRecord


def fit_tokens(req: CompletionsRequest, prompt_tokens: int, context: int, cap: int = 0) -> int:
    """The tokens to generate after a prompt of `prompt_tokens`, as vLLM reckons them (limits.max_new_tokens;
    the default 16 counts as asked, as in vLLM's CompletionRequest), lowered to `cap` (0: none);
    INVALID_ARGUMENT (context_length_exceeded) naming the prompt, or max_tokens when the request gave it."""
    if req.max_tokens == 0:  # echo alone: nothing generated, the prompt must fit
        if prompt_tokens > context:
            raise limits.context_exceeded(context, prompt_tokens, 0, "prompt")
        return 0
    return limits.max_new_tokens(prompt_tokens, context, req.max_tokens, cap=cap, prompt_param="prompt",
                                 tokens_param="max_tokens" if req.max_tokens_given else "prompt")


async def encode(service: ChatService, req: CompletionsRequest) -> list[list[int]]:
    """Each prompt's token ids (text through the model's tokenizer, without the chat template)."""
    out = []
    for i, prompt in enumerate(req.prompts):
        if isinstance(prompt, str):
            ids = await service.agent.encode_chat(compute_pb2.EncodeChatRequest(
                text=prompt, add_special_tokens=req.add_special_tokens))
        else:
            ids = list(prompt)
        if not ids:
            raise ChatError("INVALID_ARGUMENT", f"prompt[{i}] has no tokens", "prompt")
        out.append(ids)
    return out


class CompletionTurns:
    """Runs completions requests' turns for one API (its service's admission, agent and metrics)."""

    def __init__(self, service: ChatService, finishes: FinishCounts):
        self.service = service
        self.finishes = finishes

    async def run(self, user: str, req: CompletionsRequest, prompts: Sequence[list[int]],
                  start_ns: int) -> AsyncIterator[Token | Finished]:
        """The choices' tokens as they come, each choice's Finished once it ends (prompts: token ids,
        checked against the context)."""
        tenant = self.service.settings.tenant_of(user)
        try:
            async with contextlib.aclosing(self._admitted(user, tenant, req, prompts, start_ns)) as events:
                async for event in events:
                    yield event
        except ChatError as exc:
            self.service.tenants.failed(tenant, exc.code)
            raise
        except (GeneratorExit, asyncio.CancelledError):
            self.service.tenants.failed(tenant, "CANCELLED")
            self.finishes.finished("abort", req.choices)
            raise
        except BaseException:
            self.service.tenants.failed(tenant, "INTERNAL")
            raise

    async def _admitted(self, user: str, tenant: str, req: CompletionsRequest, prompts: Sequence[list[int]],
                        start_ns: int) -> AsyncIterator[Token | Finished]:
        service = self.service
        limits.check_sampling(req.sampling.temperature, req.sampling.top_p)
        context_id = sessions.new_context_id()
        queued_ns = time.time_ns()
        async with service.admission.turn(user, (user, context_id), sum(map(len, prompts)) * req.n):
            waited_s = (time.time_ns() - queued_ns) / 1e9
            try:
                async for event in self._turn(user, tenant, context_id, req, prompts, start_ns, waited_s):
                    yield event
            except BaseException:
                service.turns_failed += 1
                raise
        service.turns_completed += 1

    async def _turn(self, user: str, tenant: str, context_id: str, req: CompletionsRequest,
                    prompts: Sequence[list[int]], start_ns: int,
                    waited_s: float) -> AsyncIterator[Token | Finished]:
        info = await self.service.agent.info()
        request_id = uuid.uuid4().hex
        log_request_id.set(request_id)
        turns = []
        for p, ids in enumerate(prompts):
            shared = await self.service.shared_prefix.tokens(tenant, info.model, ids)
            for j in range(req.n):
                sampling = compute_pb2.Sampling()
                sampling.CopyFrom(req.sampling)
                sampling.seed = (sampling.seed + j) % (1 << 64)
                index = p * req.n + j
                turns.append(compute_pb2.TurnRequest(
                    request_id=request_id if index == 0 else f"{request_id}-{index}", user_id=user,
                    context_id=context_id, tenant=tenant, token_ids=ids, max_new_tokens=req.max_tokens,
                    sampling=sampling, shared_prefix_tokens=shared, ignore_eos=req.ignore_eos))
        logger.info("completion %s: user %s, %d prompts (%s tokens), %d choices each", request_id, user,
                    len(prompts), ",".join(str(len(ids)) for ids in prompts), req.n)
        timer = TurnTimer(tenant, start_ns, waited_s)
        counted = frontend_pb2.TurnSummary()
        replicas: set[str] = set()
        routes = [Route() for _ in turns]
        for i in range(len(turns)):  # a prompt's other choices go to its first's replica (prefilled once)
            if i % req.n:
                routes[i].follow = routes[i - i % req.n]
        async for event in merged([self._choice(i, turn, routes[i], timer) for i, turn in enumerate(turns)],
                                  req.n):
            if isinstance(event, Finished):
                rec = event.record
                timer.request_done(len(prompts[event.index // req.n]), rec)
                replicas.add(rec.replica)
                self.finishes.finished(rec.finish_reason or "length")
                counted.tokens_out += rec.tokens_out
                if event.index % req.n == 0:  # a prompt counts once
                    counted.tokens_prefilled += rec.tokens_prefilled
                    counted.tokens_reused += rec.tokens_reused
            yield event
        timer.done(time.time_ns())
        self.service.tenants.finished(tenant, counted)
        logger.info("completion %s done on %s: %d tokens out, %d prompt tokens reused", request_id,
                    ", ".join(sorted(r for r in replicas if r)) or "the agent", counted.tokens_out,
                    counted.tokens_reused)

    async def _choice(self, index: int, turn: compute_pb2.TurnRequest, route: Route,
                      timer: TurnTimer) -> AsyncIterator[Token | Finished]:
        """The choice's tokens and its Finished; the timer observes its tokens (and the first choice's
        text as the request's)."""
        record = None
        async for event in self.service.agent.generate(turn, route):
            if event.HasField("token"):
                now_ns = time.time_ns()
                timer.token(index, now_ns)
                if index == 0 and event.token.text:
                    timer.text(now_ns)
                yield Token(index, event.token)
            elif event.HasField("record"):
                record = event.record
        if record is None:
            raise ChatError("UNAVAILABLE", "the agent ended the turn without its record")
        if not record.finish_reason:  # an older node: no reason given
            record.finish_reason = "length" if record.tokens_out >= turn.max_new_tokens else "stop"
        yield Finished(index, record)
