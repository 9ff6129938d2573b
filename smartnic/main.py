"""`kvtb serve smartnic [--config FILE]`: the SmartNIC agent as a gRPC server."""
from __future__ import annotations

import argparse
import concurrent.futures
import logging
import signal
import threading

import grpc

from kvtb.grpc_health import add_health_and_reflection
from kvtb.heap import keep_large_buffers_in_the_heap
from kvtb.launch import announce_ready
from kvtb.logs import setup_logging
from kvtb.metrics import add_collector, start_metrics_server
from kvtb.service_metrics import agent_families
from kvtb.settings import SettingsError, load_settings
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
from smartnic.agent import Agent
from smartnic.compute_proxy import ComputeProxyServicer
from smartnic.match_action_servicer import MatchActionServicer
from smartnic.settings import SmartNicSettings
from smartnic.smartnic_servicer import SmartNicServicer

logger = logging.getLogger(__name__)

SERVICE_NAMES = [smartnic_pb2.DESCRIPTOR.services_by_name["SmartNic"].full_name,
                 smartnic_pb2.DESCRIPTOR.services_by_name["MatchAction"].full_name,
                 compute_pb2.DESCRIPTOR.services_by_name["ComputeNode"].full_name]


def serve(settings: SmartNicSettings):
    """Start the agent and its server; return (server, agent, health, proxy, address)."""
    agent = Agent(settings)
    agent.start()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(settings.grpc_workers),
                         options=[("grpc.max_receive_message_length", 64 << 20),
                                  ("grpc.max_send_message_length", 64 << 20)])
    host = settings.listen_address.rpartition(":")[0]
    bound = server.add_insecure_port(settings.listen_address)
    if bound == 0:
        agent.close()
        raise RuntimeError(f"cannot listen on {settings.listen_address}")
    proxy = ComputeProxyServicer(agent, host, bound)
    smartnic_pb2_grpc.add_SmartNicServicer_to_server(SmartNicServicer(agent), server)
    smartnic_pb2_grpc.add_MatchActionServicer_to_server(MatchActionServicer(agent), server)
    compute_pb2_grpc.add_ComputeNodeServicer_to_server(proxy, server)
    health = add_health_and_reflection(server, SERVICE_NAMES)
    server.start()
    return server, agent, health, proxy, f"{host}:{bound}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb serve smartnic", description="The SmartNIC agent.")
    parser.add_argument("--config", help="YAML config file (section `smartnic`)")
    parser.add_argument("--listen", help="host:port for gRPC (overrides listen_address)")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    args = parser.parse_args(argv)
    setup_logging("smartnic", args.log_json)
    keep_large_buffers_in_the_heap()
    try:
        settings = load_settings(SmartNicSettings, "smartnic", args.config,
                                 overrides={"listen_address": args.listen})
    except SettingsError as exc:
        logger.error("%s", exc)
        return 2
    server, agent, health, proxy, address = serve(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    add_collector(lambda: agent_families(agent.snapshot()))
    metrics_address = start_metrics_server(settings.metrics_address)
    health.set_serving()
    announce_ready("smartnic", {"grpc": address, "metrics": metrics_address},
                   storage_nodes_up=sorted(agent.nodes.up()))
    logger.info("agent serving on %s; storage nodes up: %s", address, sorted(agent.nodes.up()))
    stop.wait()
    health.set_not_serving()
    server.stop(grace=2).wait()
    proxy.close()
    agent.close()
    return 0
