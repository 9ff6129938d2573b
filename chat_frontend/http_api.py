"""The OpenAI-compatible HTTP API (aiohttp), on the frontend's event loop beside its gRPC server.

Here the app is assembled: `OpenAiApi.app()` is the one place every route is added, each served by
the module named for it, as vLLM's server has them:

- POST /v1/chat/completions: chat_completions_api (a turn of a context; sessions, streams);
- POST /v1/completions: completions_api (OpenAI's legacy completions, stateless);
- POST /tokenize, POST /detokenize: tokenize_api;
- GET /v1/models, GET /v1/models/{id}, GET /health, GET /version: server_info_api (open, no token);
- GET /metrics: metrics_api (vLLM's Prometheus metrics, for operators and metrics readers).

Every error is OpenAI's JSON (`{"error": {"message", "type", "param", "code"}}`) with its status:
the handlers' refusals and aiohttp's own errors alike, through `http_errors`. A turn past the
user's fair share or a full frontend is 429 with `Retry-After` (seconds), as OpenAI's rate limits
are. A body is at most MAX_BODY_BYTES (413).
"""
from __future__ import annotations

import errno
import logging
from typing import Callable

from aiohttp import web

from chat_frontend.chat_completions_api import ChatCompletionsApi
from chat_frontend.chat_service import ChatService
from chat_frontend.completions_api import CompletionsApi
from chat_frontend.http_errors import JsonErrorRunner, openai_errors
from chat_frontend.metrics_api import MetricsApi
from chat_frontend.server_info_api import ServerInfoApi
from chat_frontend.tokenize_api import TokenizeApi

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 2 << 20  # the model's whole context of text, JSON-escaped, with room; under gRPC's 4 MiB to the encoder


class OpenAiApi:
    """The API over the frontend's ChatService; `ready()` says whether the engine behind the frontend
    answers, `model()` names the model it serves."""

    def __init__(self, service: ChatService, ready: Callable[[], bool], model: Callable[[], str]):
        self.service = service
        self.ready = ready
        self.model = model

    def app(self) -> web.Application:
        """The application with every route of the API (added here and nowhere else)."""
        chat = ChatCompletionsApi(self.service, self.model)
        completions = CompletionsApi(self.service, self.model)
        tokenize = TokenizeApi(self.service, self.model)
        info = ServerInfoApi(self.ready, self.model)
        metrics = MetricsApi(self.service, self.model)
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors])
        app.add_routes([web.post("/v1/chat/completions", chat.create),
                        web.get("/v1/models", info.models), web.get("/health", info.health),
                        web.post("/v1/completions", completions.create),
                        web.get("/v1/models/{model_id:.+}", info.retrieve_model),
                        web.post("/tokenize", tokenize.tokenize),
                        web.post("/detokenize", tokenize.detokenize),
                        web.get("/version", info.version), web.get("/metrics", metrics.metrics)])
        return app


# a request whose client disconnects has its handler cancelled (aiohttp's default since 3.9 leaves it
# running): a turn still queued for admission or in the engine's wait queue, which has written nothing yet,
# ends then and frees its place, instead of running to its last token for nobody
SERVER_OPTIONS = {"handler_cancellation": True}


async def start(api: OpenAiApi, address: str) -> tuple[web.AppRunner, str]:
    """Serve the API on address; (runner, bound host:port).

    Port 0 picks a free port; so does a fixed port that is taken (a second frontend on this
    machine), with a warning: the ready line announces the real one.
    """
    runner = JsonErrorRunner(api.app(), access_log=None, handle_signals=False, shutdown_timeout=5.0,
                             **SERVER_OPTIONS)
    await runner.setup()
    host, _, port = address.rpartition(":")
    site = web.TCPSite(runner, host, int(port))
    try:
        await site.start()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or int(port) == 0:
            raise
        logger.warning("HTTP port %s is taken; serving the OpenAI API on a free port", port)
        site = web.TCPSite(runner, host, 0)
        await site.start()
    bound_port = site._server.sockets[0].getsockname()[1]  # the real port when 0 was asked
    logger.info("OpenAI API on http://%s:%d/v1", host, bound_port)
    return runner, f"{host}:{bound_port}"
