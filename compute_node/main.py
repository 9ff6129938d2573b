"""`kvtb serve compute [--config FILE] [--policy P]`: the LLM, its KV pool and the ComputeNode service."""
from __future__ import annotations

import argparse
import logging
import secrets
import signal
import threading
import time
from concurrent import futures

import grpc

from kvtb.grpc_health import add_health_and_reflection
from kvtb.launch import announce_ready
from kvtb.logs import setup_logging
from kvtb.metrics import add_collector, start_metrics_server
from kvtb.service_metrics import compute_families
from kvtb.settings import load_settings
from kvtb_proto import compute_pb2, compute_pb2_grpc

from compute_node.settings import POLICIES, ComputeSettings
from compute_node.turn import StepSpan
from kvtb.steps import Step

logger = logging.getLogger(__name__)


def build_node(settings: ComputeSettings, model, tokenizer, listen_address: str | None = None):
    """Create the pool, register it (step 1), start the engine and the gRPC server.

    Returns (server, engine, bound address, close function); the caller starts nothing else.
    """
    from compute_node.agent_client import AgentClient
    from compute_node.chat_template import ChatEncoder
    from compute_node.cpu_offload import CpuStore
    from compute_node.engine import Engine
    from compute_node.kv_pool import KvPool, layout_for
    from compute_node.service import ComputeNodeServicer

    layout = layout_for(model.config, settings.num_slots, settings.max_context_tokens, settings.chunk_tokens)
    pool = KvPool.create(settings.shm_name, layout)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="compute-grpc"))
    port = server.add_insecure_port(listen_address or settings.listen_address)
    if not port:
        pool.close()
        raise RuntimeError(f"cannot listen on {listen_address or settings.listen_address}")
    host = (listen_address or settings.listen_address).rsplit(":", 1)[0]
    address = f"{host}:{port}"
    agent, setup = None, None
    if settings.agent_address:
        agent = AgentClient(settings.agent_address)
        needed = settings.policy == "triggered" or settings.require_agent
        start_ns = time.time_ns()
        try:
            agent.register(pool, settings.access_key or secrets.token_hex(16), settings.node_name,
                           settings.advertise_address or address,
                           settings.register_timeout_s if needed else 2.0)
            setup = StepSpan(Step.SETUP, start_ns, time.time_ns(), layout.region_bytes)
        except grpc.RpcError as exc:
            agent.close()
            agent = None
            if needed:
                pool.close()
                raise RuntimeError(f"cannot register the KV pool with the agent at {settings.agent_address}: "
                                   f"{exc.code()} {exc.details()}") from exc
            logger.info("running without the agent (%s): policies resident, recompute and cpu only",
                        exc.code())
    cpu_store = None
    if settings.storage_fabric_addresses:
        cpu_store = CpuStore(settings.storage_fabric_addresses, settings.storage_host_nqn,
                             settings.storage_nsid, settings.key_salt)
    engine = Engine(settings, model, tokenizer, pool, agent=agent, cpu_store=cpu_store, setup_span=setup).start()
    keeper_stop = threading.Event()
    if agent is not None:
        agent.keep_registered(keeper_stop)
    compute_pb2_grpc.add_ComputeNodeServicer_to_server(ComputeNodeServicer(engine, ChatEncoder(tokenizer)), server)
    health = add_health_and_reflection(server, [compute_pb2.DESCRIPTOR.services_by_name["ComputeNode"].full_name])

    def close() -> None:
        health.set_not_serving()
        keeper_stop.set()
        server.stop(grace=2.0).wait()
        engine.stop()
        if agent is not None:
            agent.deregister()
            agent.close()
        if cpu_store is not None:
            cpu_store.close()
        pool.close()

    return server, engine, address, health, close


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb serve compute", description=__doc__)
    parser.add_argument("--config", help="YAML config file (section `compute`)")
    parser.add_argument("--policy", choices=POLICIES, help="KV policy (default: the config's)")
    parser.add_argument("--listen", help="gRPC address (default: the config's listen_address)")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    args = parser.parse_args(argv)
    setup_logging("compute", args.log_json)
    settings = load_settings(ComputeSettings, "compute", args.config, overrides={"policy": args.policy})
    from compute_node.model_loader import load_model
    model, tokenizer = load_model(settings.model_cache_dir, settings.torch_threads)
    server, engine, address, health, close = build_node(settings, model, tokenizer, args.listen)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    health.set_serving()
    add_collector(lambda: compute_families(engine.snapshot()))
    metrics_address = start_metrics_server(settings.metrics_address)
    announce_ready("compute", {"grpc": address, "metrics": metrics_address}, policy=settings.policy,
                   policies=engine.policies())
    logger.info("compute node serving on %s (policy %s)", address, settings.policy)
    stop.wait()
    logger.info("stopping")
    close()
    return 0
