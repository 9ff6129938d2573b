"""The API's errors in OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`), with their
HTTP status: the handlers' refusals and aiohttp's own errors.

A handler answers a ChatError with `refusal` (its status from the error's code; a turn past the
user's fair share or a full frontend is 429 with `Retry-After` in seconds, as OpenAI's rate limits
are) and anything else with `error_response`; `refused` and `failed` do the same, logged, for the
endpoints beyond chat (completions, tokenize, metrics: a prompt there is `prompt`).

Two places make aiohttp's own: the `openai_errors` middleware turns what aiohttp raises inside a
request (413 for a body over `client_max_size`, 404, 405, a body it cannot decode) and a bug's 500
into OpenAI's error object; `JsonErrorRunner` serves the app on connections whose `handle_error`
answers in the same shape what fails before any route (a request line or header too long, too
many headers, a request that is not HTTP). Neither echoes the request's bytes.
"""
from __future__ import annotations

import logging
import math

from aiohttp import http_exceptions, web

from chat_frontend import limits
from chat_frontend import openai_format as oa
from chat_frontend.errors import ChatError

logger = logging.getLogger(__name__)


def error_response(code: str, message: str, headers: dict | None = None,
                   param: str | None = None, openai_code: str | None = None) -> web.Response:
    """The error of a ChatError code (INVALID_ARGUMENT, NOT_FOUND, ...) in OpenAI's shape, with its status."""
    status, body = oa.error_body(code, message, param, openai_code)
    return web.json_response(body, status=status, headers=headers)


def refusal(exc: ChatError, headers: dict | None = None, context_param: str = "messages") -> web.Response:
    """The refusal in OpenAI's shape; a busy frontend's (429) says when to try again (Retry-After, s).
    A prompt past the context that the compute node found names `context_param` (the request's prompt)."""
    if exc.retry_after_s is not None:
        headers = {**(headers or {}), "Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    param = exc.param
    if param is None and exc.openai_code == limits.CONTEXT_LENGTH_EXCEEDED:
        param = context_param
    elif param is None and exc.code == "INVALID_ARGUMENT":  # the compute node's: it names sampling.<field>
        param = oa.param_of(exc.message)
    return error_response(exc.code, exc.message, headers, param, exc.openai_code)


def refused(what: str, exc: ChatError) -> web.Response:
    """`what` (completion, tokenize, ...) refused, logged: a request whose prompt is `prompt`."""
    logger.info("%s refused: %s", what, exc)
    return refusal(exc, context_param="prompt")


def failed(what: str, exc: Exception) -> web.Response:
    """`what` failed (a bug, a broken dependency), logged with its traceback: a 500 naming the exception."""
    logger.exception("%s failed", what)
    return error_response("INTERNAL", f"frontend: {type(exc).__name__}: {exc}")


def _json(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response(oa.http_error_body(status, message), status=status, headers=headers)


@web.middleware
async def openai_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's own HTTP errors (413, 404, 405) and a bug's 500 in OpenAI's JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        allow = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return _json(exc.status, exc.text or exc.reason, allow)
    except web.RequestPayloadError as exc:  # a body that cannot be decoded (bad gzip, bad chunks)
        return _json(400, f"the body cannot be read: {exc.__cause__ or exc}")
    except Exception as exc:
        if request.writer is not None and request.writer.output_size:  # a stream began: too late
            raise
        logger.exception("%s %s failed", request.method, request.path)
        status, body = oa.error_body("INTERNAL", f"frontend: {type(exc).__name__}")
        return web.json_response(body, status=status)


def _unparsable(status: int, exc: BaseException | None) -> str:
    """What to tell a client whose request aiohttp could not parse (never echoing its bytes)."""
    if isinstance(exc, http_exceptions.LineTooLong):
        return "the request line or a header is too long"
    if status >= 500 or exc is None:
        return "the frontend failed to handle the request"
    return f"the request is not valid HTTP ({type(exc).__name__})"


class _ConnectionHandler(web.RequestHandler):
    """aiohttp's connection handler, answering what fails before any route in OpenAI's JSON."""

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; refuses once a response began
        response = _json(status, _unparsable(status, exc))
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _ConnectionHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """An AppRunner whose connections are `_ConnectionHandler`s.

    aiohttp (3.14) builds its Server in `Application._make_handler` with no hook for the
    handler's class, so the server it made becomes a `_Server` (which adds only `__call__`).
    """

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server
        return server


def stream_error(exc: Exception) -> str:
    """The one `data: {"error": ...}` event a stream ends with when its turn fails after it began: a
    ChatError as it says, anything else (a bug) as INTERNAL, naming only its type."""
    if isinstance(exc, ChatError):
        return oa.sse(oa.error_body(exc.code, exc.message, exc.param, exc.openai_code)[1])
    return oa.sse(oa.error_body("INTERNAL", f"frontend: {type(exc).__name__}")[1])
