"""GET /v1/models, GET /v1/models/{id}, GET /health and GET /version: what the frontend serves, and whether.

Open, as vLLM's server has them: no token. /health is 200 with the model once the engine behind
the frontend answers, 503 `{"status": "loading"}` before; /v1/models and /v1/models/{id} are 503
(OpenAI's error) until then, and a model id other than the served one is OpenAI's 404
model_not_found. /version is the installed package's version.
"""
from __future__ import annotations

import importlib.metadata
from typing import Callable

from aiohttp import web

from chat_frontend import completions_format as cf
from chat_frontend.http_errors import error_response

PACKAGE = "kvtestbed"


class ServerInfoApi:
    """The handlers of these endpoints; `ready()`: whether the engine answers; `model()` names its model."""

    def __init__(self, ready: Callable[[], bool], model: Callable[[], str]):
        self.ready = ready
        self.model = model

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready():
            return web.json_response({"status": "loading"}, status=503)
        return web.json_response({"status": "ok", "model": self.model()})

    async def models(self, request: web.Request) -> web.Response:
        if not self.ready():
            return error_response("UNAVAILABLE", "the model is still loading")
        return web.json_response({"object": "list", "data": [cf.model_object(self.model())]})

    async def retrieve_model(self, request: web.Request) -> web.Response:
        if not self.ready():
            return error_response("UNAVAILABLE", "the model is still loading")
        model_id = request.match_info["model_id"]
        if model_id != self.model():
            return web.json_response({"error": {
                "message": f"The model '{model_id[:200]}' does not exist", "type": "invalid_request_error",
                "param": "model", "code": "model_not_found"}}, status=404)
        return web.json_response(cf.model_object(model_id))

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": importlib.metadata.version(PACKAGE)})
