"""POST /tokenize and POST /detokenize, as vLLM's server has them.

Thin: the handlers parse (tokenize_format), ask the compute node through the agent (EncodeChat,
Decode) and write JSON. They take the user's bearer token (401 before anything else); a model named
must be the served one. /tokenize's `return_token_strs` decodes each token alone, DECODE_BATCH
Decode calls at a time, for at most tokenize_format.MAX_TOKEN_STRS tokens.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from aiohttp import web

from chat_frontend import completions_format as cf
from chat_frontend import tokenize_format as tf
from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.http_errors import failed, refused

DECODE_BATCH = 64  # /tokenize's token_strs: Decode calls at once


async def token_strs(decode, token_ids: list[int]) -> list[str]:
    """Each token's text alone, DECODE_BATCH calls at a time."""
    out: list[str] = []
    for start in range(0, len(token_ids), DECODE_BATCH):
        out.extend(await asyncio.gather(*(decode([i]) for i in token_ids[start:start + DECODE_BATCH])))
    return out


class TokenizeApi:
    """The handlers of /tokenize and /detokenize over the frontend's agent; `model()` is the served model."""

    def __init__(self, service: ChatService, model: Callable[[], str]):
        self.service = service
        self.model = model

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            self.service.user("", request.headers.items())
            req = tf.parse_tokenize(await request.read())
            if req.model is not None:
                cf.check_model(req.model, self.model())
            info = await self.service.agent.info()
            ids = await self.service.agent.encode_chat(req.encode)
            strs = None
            if req.return_token_strs:
                if len(ids) > tf.MAX_TOKEN_STRS:
                    raise ChatError("INVALID_ARGUMENT", f"return_token_strs for {len(ids)} tokens: at most "
                                    f"{tf.MAX_TOKEN_STRS}", "return_token_strs")
                strs = await token_strs(self.service.agent.decode, ids)
        except ChatError as exc:
            return refused("tokenize", exc)
        except Exception as exc:
            return failed("tokenize", exc)
        return web.json_response(tf.tokenize_response(ids, info.max_context_tokens, strs))

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            self.service.user("", request.headers.items())
            model, ids = tf.parse_detokenize(await request.read())
            if model is not None:
                cf.check_model(model, self.model())
            text = await self.service.agent.decode(ids)
        except ChatError as exc:
            return refused("detokenize", exc)
        except Exception as exc:
            return failed("detokenize", exc)
        return web.json_response({"prompt": text})
