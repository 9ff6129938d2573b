"""The chat frontend as a service: its gRPC server and OpenAI HTTP API on one uvloop event loop (`serve`).

The loop runs in a thread of its own, so the frontend is started and stopped like every other
node; everything the frontend does happens on that loop, the replicas' health loop too
(`replicas.Replicas.run`): the frontend is SERVING once a replica answers.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging

import grpc

from chat_frontend import http_api, vllm_metrics
from chat_frontend import metrics as frontend_metrics
from chat_frontend.chat_service import ChatService
from chat_frontend.frontend_servicer import ChatFrontendServicer
from chat_frontend.replicas import Replicas
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb.grpc_health import Health, add_health_and_reflection
from kvtb.loop_thread import LoopThread
from kvtb.metrics import MetricsEndpoint
from kvtb.rpc import Security, server_options
from kvtb_proto import frontend_pb2
from scale import dilation, software

logger = logging.getLogger(__name__)

SERVICE_NAME = frontend_pb2.DESCRIPTOR.services_by_name["ChatFrontend"].full_name


def serve(settings: FrontendSettings) -> FrontendNode:
    """The frontend of these settings, not started yet."""
    return FrontendNode(settings)


class FrontendNode:
    """The running frontend (a kvtb.node.Node). Not thread-safe: one owner starts and stops it."""

    service = "frontend"

    def __init__(self, settings: FrontendSettings):
        self.settings = settings
        self.addresses: dict[str, str] = {}
        self.health: Health | None = None
        self._loop = LoopThread("frontend-loop")

    def start(self) -> None:
        """Run the loop in its thread; return once both servers listen (or raise why they cannot)."""
        self.addresses = self._loop.start(self._serve)

    def ready_extra(self) -> dict:
        return {}

    def stop(self) -> None:
        """Stop taking requests and wait until the loop has closed everything."""
        self._loop.stop()

    async def _serve(self, started: concurrent.futures.Future, stop: asyncio.Event) -> None:
        s = self.settings
        store = SessionStore(s.db_path)
        agent = Replicas.connect(s, Security.of("frontend", s.credentials_dir, s.insecure))
        service = ChatService(s, store, agent)
        server = grpc.aio.server(options=server_options())
        servicer = ChatFrontendServicer(service, agent)
        server.add_generic_rpc_handlers((servicer.handler(),))  # it parses requests: INVALID_ARGUMENT, not UNKNOWN
        self.health = add_health_and_reflection(server, [SERVICE_NAME], aio=True)
        host = s.listen_address.rsplit(":", 1)[0]
        port = server.add_insecure_port(s.listen_address)
        await server.start()
        api = http_api.OpenAiApi(service, lambda: bool(agent.model), lambda: agent.model)
        runner, http_address = await http_api.start(api, s.http_address)
        # the metrics port: the kvtb: families and, as the API port's /metrics shows them, vLLM's (no token)
        vllm = vllm_metrics.reader(lambda: agent.model, vllm_metrics.StatsCache(agent.compute_stats),
                                   service.finishes.counts, asyncio.get_running_loop())
        metrics = MetricsEndpoint(s.metrics_address, frontend_metrics.reader(service.tenants,
                                                                             servicer.frontend_figures,
                                                                             agent.figures), vllm)
        # under a profile the frontend is software on both worlds: its loop's CPU time stretched by D
        # (the idle loop's own rate measured first, before anyone knows where it listens)
        stretch = await software.on_loop(dilation.current(), software.FRONTEND)
        started.set_result({"grpc": f"{host}:{port}", "http": http_address, "metrics": metrics.address})
        logger.info("frontend listening on %s:%d (OpenAI API http://%s/v1), %s %s routed %s, data %s", host,
                    port, http_address, "agent" if len(agent.replicas) == 1 else "replicas", agent.address,
                    s.routing, s.data_dir)
        waiter = asyncio.create_task(agent.run(self.health, s.health_interval_s, s.info_retry_s))
        await stop.wait()
        self.health.set_not_serving()
        waiter.cancel()
        if stretch is not None:
            stretch.cancel()
        await runner.cleanup()
        await server.stop(grace=5.0)
        await agent.close()
        metrics.close()
        store.close()
