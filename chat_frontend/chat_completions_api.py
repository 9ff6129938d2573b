"""POST /v1/chat/completions: one turn of a context, as JSON or server-sent events.

Thin: the handler parses (openai_format), runs the turn through ChatService exactly as the gRPC
servicer does, and writes JSON or server-sent events. The user is the `Authorization: Bearer`
token; the session (a context id of that user) is the `X-Session-Id` header, else a header the
settings name (`session_headers`, e.g. AIPerf's X-Correlation-ID), else OpenAI's `user` field if
the settings say so (`session_from_user_field`); none: a new context. A response always carries
the context id in X-Session-Id.

A stream is: for each choice a chunk whose delta carries the role, one chunk per piece of text as it
comes (with its index, and its tokens' logprobs when asked), a chunk with an empty delta and the
finish_reason per choice (as OpenAI sends it: the text is never held back to learn whether it is
the last), the usage chunk when asked, `data: [DONE]`. The response begins with the first
generated token (or the turn's end), so a refusal of the compute node (a JSON schema it cannot
compile, a stop token outside the vocabulary) is still a 400; an error after that is one
`data: {"error": ...}` event before `[DONE]`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from typing import Callable

from aiohttp import web

from chat_frontend import openai_format as oa
from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.http_errors import error_response, refusal, stream_error
from chat_frontend.sessions import SESSION_HEADER, named_session
from kvtb_proto import frontend_pb2

logger = logging.getLogger(__name__)


class ChatCompletionsApi:
    """The handler of POST /v1/chat/completions over the frontend's ChatService; `model()` names the model."""

    def __init__(self, service: ChatService, model: Callable[[], str]):
        self.service = service
        self.model = model

    async def create(self, request: web.Request) -> web.StreamResponse:
        try:
            req, session = await self._parse(request)
        except ChatError as exc:
            logger.info("chat completion refused: %s", exc)
            return refusal(exc)
        turn = frontend_pb2.ChatRequest(context_id=session, message=req.message, n=req.n,
                                        max_new_tokens=req.max_new_tokens, sampling=req.sampling)
        events = self.service.chat(turn, list(request.headers.items()), req.history, req.system,
                                   whole=req.whole, ignore_eos=req.ignore_eos,
                                   max_tokens_param=req.max_tokens_param, default_max_tokens=0)
        completion_id = "chatcmpl-" + (req.request_id or uuid.uuid4().hex[:24])
        headers = None
        try:
            first = await anext(events)  # validated, admitted: the context id is known
            headers = {SESSION_HEADER: first.context_id}
            second = await anext(events)  # the compute node took the turn: its first text (or the end)
        except ChatError as exc:
            logger.info("chat completion refused: %s", exc)
            return refusal(exc, headers)
        except Exception as exc:  # a bug or a broken store: say so, keep serving
            logger.exception("chat completion failed")
            return error_response("INTERNAL", f"frontend: {type(exc).__name__}: {exc}", headers)
        if req.stream:
            return await self._stream(request, req, _chain(second, events), completion_id, headers)
        try:
            choices = await _choices(_chain(second, events), req.n)
        except ChatError as exc:
            logger.info("chat completion failed: %s", exc)
            return refusal(exc, headers)
        except Exception as exc:
            logger.exception("chat completion failed")
            return error_response("INTERNAL", f"frontend: {type(exc).__name__}: {exc}", headers)
        return web.json_response(oa.completion(completion_id, req, choices), headers=headers)

    async def _parse(self, request: web.Request) -> tuple[oa.CompletionRequest, str]:
        """The request (its sampling defaults filled in) and the session it names ("" for a new context)."""
        self.service.user("", request.headers.items())  # 401 before anything else
        settings = self.service.settings
        req = oa.parse_request(await request.read(), settings.max_n)
        if req.model != self.model():
            raise ChatError("NOT_FOUND", f"the model {req.model!r} does not exist; this frontend "
                            f"serves {self.model()!r} (GET /v1/models)")
        info = await self.service.agent.info()
        req = dataclasses.replace(req, sampling=oa.apply_defaults(req.sampling, req.given,
                                                                  info.generation_defaults))
        session = named_session(request.headers, settings.session_headers,
                                req.user if settings.session_from_user_field else None)
        return req, session

    async def _stream(self, request: web.Request, req: oa.CompletionRequest, events, completion_id: str,
                      headers: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        summaries = []
        try:
            await response.prepare(request)  # the client may have gone while its turn queued
            for i in range(req.n):
                await response.write(oa.sse(oa.chunk(completion_id, req.model,
                                                     {"role": "assistant", "content": ""}, index=i)))
            async for event in events:
                if event.WhichOneof("event") == "text":
                    if not event.text and not req.logprobs:
                        continue  # tokens that added no text, logprobs not asked: nothing to say
                    lp = oa.logprobs(event.tokens, req.token_ids_as_tokens) if req.logprobs else None
                    await response.write(oa.sse(oa.chunk(completion_id, req.model, {"content": event.text},
                                                         index=event.choice, logprobs_object=lp)))
                elif event.WhichOneof("event") == "summary":
                    summary = event.summary
                    summaries.append(summary)
                    await response.write(oa.sse(oa.chunk(
                        completion_id, req.model, {}, summary.finish_reason or "stop", index=event.choice,
                        reason=oa.stop_reason(summary, req.sampling))))
            if req.include_usage and summaries:
                await response.write(oa.sse(oa.chunk(completion_id, req.model, None, summaries=summaries)))
        except ConnectionResetError:  # the client went away: stop the turn (the agent call ends)
            logger.info("chat completion %s: the client went away", completion_id)
            await events.aclose()
            return response
        except ChatError as exc:
            logger.info("chat completion failed while streaming: %s", exc)
            await response.write(stream_error(exc))
        except Exception as exc:
            logger.exception("chat completion failed while streaming")
            await response.write(stream_error(exc))
        await response.write(oa.sse("[DONE]"))
        await response.write_eof()
        return response


async def _chain(first, events):
    """first, then the rest of events (closing them when this is closed)."""
    async with contextlib.aclosing(events):
        yield first
        async for event in events:
            yield event


async def _choices(events, n: int) -> list[tuple[frontend_pb2.TurnSummary, list]]:
    """(summary, tokens) per choice, in choice order, from a turn's events."""
    tokens: list[list] = [[] for _ in range(n)]
    summaries: dict[int, frontend_pb2.TurnSummary] = {}
    async for event in events:
        if event.WhichOneof("event") == "text":
            tokens[event.choice].extend(event.tokens)
        elif event.WhichOneof("event") == "summary":
            summaries[event.choice] = event.summary
    if len(summaries) != n:
        raise ChatError("INTERNAL", f"the turn ended with {len(summaries)} of its {n} choices' summaries")
    return [(summaries[i], tokens[i]) for i in range(n)]
