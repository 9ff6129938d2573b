"""GET /metrics: vLLM's Prometheus metrics of the frontend and the compute nodes behind it (vllm_metrics).

It takes the token of an operator or a metrics reader (settings `operators`, `metrics_readers`;
Prometheus sends it as `authorization: credentials`): it shows every tenant's traffic and the whole
system's load, which one user may not see of the others (a user's token is 403; users have
SystemStats' aggregates). The frontend's metrics port shows the same without a token, inside the
deployment's network (vllm_metrics).
"""
from __future__ import annotations

from typing import Callable

from aiohttp import web

from chat_frontend import vllm_metrics
from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.http_errors import refused


class MetricsApi:
    """The handler of GET /metrics; the compute nodes' stats are cached (vllm_metrics.StatsCache)."""

    def __init__(self, service: ChatService, model: Callable[[], str]):
        self.service = service
        self.model = model
        self.stats = vllm_metrics.StatsCache(lambda: self.service.agent.compute_stats())

    async def metrics(self, request: web.Request) -> web.Response:
        try:
            user = self.service.user("", request.headers.items())
            settings = self.service.settings
            if user not in settings.operators and user not in settings.metrics_readers:
                raise ChatError("PERMISSION_DENIED", "/metrics shows every tenant's traffic: it takes the "
                                "token of an operator or a metrics reader (settings operators, "
                                "metrics_readers)")
        except ChatError as exc:
            return refused("metrics", exc)
        body = await vllm_metrics.scrape(self.model() or "unknown", self.stats, self.service.finishes.counts)
        return web.Response(body=body, headers={"Content-Type": vllm_metrics.CONTENT_TYPE})
