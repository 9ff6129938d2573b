"""`kvtb serve frontend`: the chat frontend's gRPC server and OpenAI HTTP API on one uvloop loop."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

import grpc
import uvloop

from chat_frontend import http_api
from chat_frontend import metrics as frontend_metrics
from chat_frontend import settings as settings_mod
from chat_frontend.agent_client import AgentClient
from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.servicer import ChatFrontendServicer
from chat_frontend.store import SessionStore
from kvtb.grpc_health import Health, add_health_and_reflection
from kvtb.launch import announce_ready
from kvtb.logs import setup_logging
from kvtb.metrics import start_metrics_server
from kvtb.settings import SettingsError
from kvtb_proto import frontend_pb2, frontend_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = frontend_pb2.DESCRIPTOR.services_by_name["ChatFrontend"].full_name


async def wait_for_agent(agent: AgentClient, health: Health, retry_s: float) -> None:
    """Set SERVING once the agent answers Info (the model is loaded behind it)."""
    while True:
        try:
            info = await agent.info(timeout_s=5.0)
        except ChatError as exc:
            logger.info("waiting for the agent at %s: %s", agent.address, exc.message)
            await asyncio.sleep(retry_s)
            continue
        logger.info("agent answers: model %s, context %d tokens", info.model, info.max_context_tokens)
        health.set_serving()
        return


async def serve(settings: settings_mod.FrontendSettings, stop: asyncio.Event) -> None:
    """Run the frontend until `stop` is set."""
    store = SessionStore(settings.db_path)
    agent = AgentClient(settings.agent_address, settings.agent_timeout_s)
    service = ChatService(settings, store, agent)
    server = grpc.aio.server()
    servicer = ChatFrontendServicer(service, agent)
    frontend_pb2_grpc.add_ChatFrontendServicer_to_server(servicer, server)
    health = add_health_and_reflection(server, [SERVICE_NAME], aio=True)
    host = settings.listen_address.rsplit(":", 1)[0]
    port = server.add_insecure_port(settings.listen_address)
    await server.start()
    api = http_api.OpenAiApi(service, lambda: bool(agent.model), lambda: agent.model)
    runner, http_address = await http_api.start(api, settings.http_address)
    frontend_metrics.install(service.tenants, servicer.frontend_figures)
    metrics_address = start_metrics_server(settings.metrics_address)
    announce_ready("frontend", {"grpc": f"{host}:{port}", "http": http_address, "metrics": metrics_address})
    logger.info("frontend listening on %s:%d (OpenAI API http://%s/v1), agent %s, data %s", host, port,
                http_address, settings.agent_address, settings.data_dir)
    waiter = asyncio.create_task(wait_for_agent(agent, health, settings.info_retry_s))
    await stop.wait()
    logger.info("frontend stopping")
    health.set_not_serving()
    waiter.cancel()
    await runner.cleanup()
    await server.stop(grace=5.0)
    await agent.close()
    store.close()


async def _main(settings: settings_mod.FrontendSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb serve frontend", description="Run the chat frontend.")
    parser.add_argument("--config", help="config file (default $KVTB_CONFIG)")
    parser.add_argument("--listen", help="host:port to listen on (overrides the config)")
    parser.add_argument("--agent", help="the SmartNIC agent's address (overrides the config)")
    parser.add_argument("--data-dir", help="where sessions are kept (overrides the config)")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    args = parser.parse_args(argv)
    setup_logging("frontend", args.log_json)
    try:
        settings = settings_mod.load(args.config, listen_address=args.listen,
                                     agent_address=args.agent, data_dir=args.data_dir)
    except SettingsError as exc:
        print(f"kvtb serve frontend: {exc}", file=sys.stderr)
        return 2
    try:
        uvloop.run(_main(settings))
    except (RuntimeError, OSError) as exc:  # e.g. the address is taken
        logger.error("frontend failed: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
