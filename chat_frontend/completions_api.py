"""The OpenAI API's routes beyond chat: /v1/completions, /v1/models/{id}, /tokenize, /detokenize,
/version and /metrics, as vLLM's server has them. (Being written: issue 32.)"""
from __future__ import annotations

from aiohttp import web


def routes(api) -> list[web.RouteDef]:
    """The routes of these endpoints on the API of `api` (an http_api.OpenAiApi)."""
    return []
