"""POST /v1/completions: OpenAI's (legacy) completions, as vLLM's server has them.

Thin: the handler parses (completions_format), runs the turns (completion_turns) and writes JSON or
server-sent events as chat_completions_api does for chat. It takes the user's bearer token (401
before anything else). Completions are stateless: n choices of each prompt, no transcript kept.

A completions stream: with echo, each choice's prompt text first; a chunk per generated token that
adds text (or carries logprobs), a chunk with the finish_reason per choice, the usage chunk when
asked, `data: [DONE]`. The response begins with the first generated token, so the compute node's
refusal is still a 400; an error after that is one `data: {"error": ...}` event before [DONE].
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from typing import Callable

from aiohttp import web

from chat_frontend import completions_format as cf
from chat_frontend import limits
from chat_frontend import openai_format as oa
from chat_frontend.chat_service import ChatService
from chat_frontend.completion_turns import CompletionTurns, Finished, Token, encode, fit_tokens
from chat_frontend.errors import ChatError
from chat_frontend.http_errors import failed, refused, stream_error

logger = logging.getLogger(__name__)


class CompletionsApi:
    """The handler of POST /v1/completions over the frontend's ChatService; `model()` is the served model."""

    def __init__(self, service: ChatService, model: Callable[[], str]):
        self.service = service
        self.model = model
        self.turns = CompletionTurns(service, service.finishes)

    async def create(self, request: web.Request) -> web.StreamResponse:
        start_ns = time.time_ns()
        try:
            user = self.service.user("", request.headers.items())  # 401 before anything else
            settings = self.service.settings
            req = cf.parse_request(await request.read(), settings.max_n)
            cf.check_model(req.model, self.model())
            info = await self.service.agent.info()
            req = dataclasses.replace(req, sampling=oa.apply_defaults(req.sampling, req.given,
                                                                      info.generation_defaults))
            prompts = await encode(self.service, req)
            context = limits.context_tokens(info)
            fitted = [fit_tokens(req, len(ids), context, settings.max_new_tokens_cap) for ids in prompts]
            req = dataclasses.replace(req, max_tokens=min(fitted))  # every prompt's (the cap's, if lower)
            echoes = await self._echoes(req, prompts)
        except ChatError as exc:
            return refused("completion", exc)
        except Exception as exc:
            return failed("completion", exc)
        completion_id = "cmpl-" + (req.request_id or uuid.uuid4().hex[:24])
        if req.max_tokens == 0:  # echo alone: the prompts, nothing generated
            return await self._echo_only(request, req, completion_id, prompts, echoes)
        events = self.turns.run(user, req, prompts, start_ns)
        try:
            first = await anext(events)  # admitted, and the compute node took the turn
        except ChatError as exc:
            return refused("completion", exc)
        except Exception as exc:
            return failed("completion", exc)
        events = _chain(first, events)
        if req.stream:
            return await self._stream(request, req, completion_id, events, prompts, echoes)
        try:
            choices = await _collect(events, req, prompts, echoes)
        except ChatError as exc:
            return refused("completion", exc)
        except Exception as exc:
            return failed("completion", exc)
        return web.json_response(cf.completion(completion_id, req, choices))

    async def _echoes(self, req: cf.CompletionsRequest, prompts: list[list[int]]) -> list[str]:
        """Each prompt's text (token ids decoded), for echo."""
        if not req.echo:
            return [""] * len(prompts)
        if all(isinstance(p, str) for p in req.prompts):
            return list(req.prompts)
        decode = self.service.agent.decode
        return [p if isinstance(p, str) else await decode(ids) for p, ids in zip(req.prompts, prompts)]

    async def _echo_only(self, request, req, completion_id, prompts, echoes) -> web.StreamResponse:
        choices = [cf.Choice(p * req.n + j, echoes[p], [], "length", prompt_tokens=len(ids))
                   for p, ids in enumerate(prompts) for j in range(req.n)]
        if not req.stream:
            return web.json_response(cf.completion(completion_id, req, choices))
        response = await _open_stream(request)
        for c in choices:
            await response.write(oa.sse(cf.chunk(completion_id, req.model, c.index, c.text)))
            await response.write(oa.sse(cf.chunk(completion_id, req.model, c.index, "", None, "length")))
        return await _close_stream(response, req, completion_id, choices)

    async def _stream(self, request, req: cf.CompletionsRequest, completion_id: str, events, prompts,
                      echoes) -> web.StreamResponse:
        response = web.StreamResponse()  # replaced once open: the client may have gone while its turn queued
        offsets = [0] * req.choices
        done = []
        try:
            response = await _open_stream(request)
            for index in range(req.choices):
                if echoes[index // req.n]:
                    await response.write(oa.sse(cf.chunk(completion_id, req.model, index, echoes[index // req.n])))
            async for event in events:
                if isinstance(event, Token):
                    token = event.token
                    if not token.text and req.logprobs is None:
                        continue
                    lp = None if req.logprobs is None else cf.logprobs([token], offsets[event.index],
                                                                         req.token_ids_as_tokens)
                    offsets[event.index] += len(token.text)
                    await response.write(oa.sse(cf.chunk(completion_id, req.model, event.index, token.text, lp)))
                elif isinstance(event, Finished):
                    choice = _finished(event, req, prompts, "", [])
                    done.append(choice)
                    await response.write(oa.sse(cf.chunk(completion_id, req.model, event.index, "", None,
                                                         choice.finish_reason, choice.stop_reason)))
        except ConnectionResetError:  # the client went away: stop the turns (their agent calls end)
            logger.info("completion %s: the client went away", completion_id)
            await events.aclose()
            return response
        except ChatError as exc:
            logger.info("completion failed while streaming: %s", exc)
            await response.write(stream_error(exc))
            done = []
        except Exception as exc:
            logger.exception("completion failed while streaming")
            await response.write(stream_error(exc))
            done = []
        return await _close_stream(response, req, completion_id, done)


def _finished(event: Finished, req: cf.CompletionsRequest, prompts, text: str, tokens: list) -> cf.Choice:
    rec = event.record
    return cf.Choice(event.index, text, tokens, rec.finish_reason, oa.stop_reason(rec, req.sampling),
                     completion_tokens=rec.tokens_out, prompt_tokens=len(prompts[event.index // req.n]),
                     cached_tokens=rec.tokens_reused)


async def _collect(events, req: cf.CompletionsRequest, prompts, echoes) -> list[cf.Choice]:
    """Every choice, once all ended."""
    tokens: list[list] = [[] for _ in range(req.choices)]
    choices = {}
    async for event in events:
        if isinstance(event, Token):
            tokens[event.index].append(event.token)
        else:
            text = echoes[event.index // req.n] + "".join(t.text for t in tokens[event.index])
            choices[event.index] = _finished(event, req, prompts, text, tokens[event.index])
    if len(choices) != req.choices:
        raise ChatError("INTERNAL", f"the request ended with {len(choices)} of its {req.choices} choices")
    return [choices[i] for i in range(req.choices)]


async def _chain(first, events):
    """first, then the rest of events (closing them when this is closed)."""
    async with contextlib.aclosing(events):
        yield first
        async for event in events:
            yield event


async def _open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def _close_stream(response: web.StreamResponse, req: cf.CompletionsRequest, completion_id: str,
                        choices: list[cf.Choice]) -> web.StreamResponse:
    if req.include_usage and choices:
        await response.write(oa.sse(cf.usage_chunk(completion_id, req.model, choices, req.n)))
    await response.write(oa.sse("[DONE]"))
    await response.write_eof()
    return response
