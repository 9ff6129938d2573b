"""The SmartNIC agent as a service: the agent, its gRPC server (SmartNic, MatchAction and the
ComputeNode proxy) and its metrics (`serve`).

The gRPC server is a grpc.aio server on a uvloop event loop in a thread of its own: the turn relay
(`ComputeProxyServicer`) is asynchronous, so a relayed turn holds no thread for its stream and the
number of turns in flight is bounded by settings (`max_relayed_turns`), not by a worker pool; turns past
the compute node's batch wait in its scheduler. The other services' methods are plain functions, run
in the server's thread pool (`grpc_workers`), as are the relay's short blocking steps (the lookup of
step 5, the start of a restore).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging

import grpc

from kvtb.grpc_health import Health, add_health_and_reflection
from kvtb.loop_thread import LoopThread
from kvtb.metrics import MetricsEndpoint
from kvtb.rpc import AioInterceptor, Authorizer, CallCounter, Security, add_port, server_options
from kvtb.service_metrics import agent_families
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
from scale import dilation, software
from smartnic.agent import Agent
from smartnic.compute_proxy_servicer import ComputeProxyServicer
from smartnic.match_action_servicer import MatchActionServicer
from smartnic.settings import SmartNicSettings
from smartnic.smartnic_servicer import SmartNicServicer

logger = logging.getLogger(__name__)

SMARTNIC, MATCH_ACTION, COMPUTE = (smartnic_pb2.DESCRIPTOR.services_by_name["SmartNic"].full_name,
                                   smartnic_pb2.DESCRIPTOR.services_by_name["MatchAction"].full_name,
                                   compute_pb2.DESCRIPTOR.services_by_name["ComputeNode"].full_name)
SERVICE_NAMES = [SMARTNIC, MATCH_ACTION, COMPUTE]

CONTROL_CALLS = 64  # calls of one peer beside its relayed turns (health, Info, Stats, counters)
COMPUTE_METHODS = ("RegisterMemory", "DeregisterMemory", "CounterAdd", "CounterSet", "CounterRead", "CounterWait",
                   "QueueTriggered", "CancelCounter", "Flush", "ReadErrors")


def access(compute_identity: str = "compute") -> dict[str, set[str]]:
    """Who may call what (kvtb.rpc.Authorizer; the operator may call everything, MatchAction and the
    requester's Lookup, ListContexts and DropContext are the operator's alone): the memory, counter and
    trigger methods only this agent's own compute node (one trust domain with it: each replica's
    compute node has its own identity); user and context ids come only from the frontend (one for
    every replica): it alone may send turns."""
    return {
        **{f"/{SMARTNIC}/{m}": {compute_identity} for m in COMPUTE_METHODS},
        f"/{SMARTNIC}/Stats": {"frontend"},
        **{f"/{COMPUTE}/{m}": {"frontend"} for m in ("Generate", "EncodeChat", "Decode", "Info", "Stats")},
    }


ACCESS = access()  # replica 0's


def serve(settings: SmartNicSettings) -> "AgentNode":
    """The agent of these settings, not started yet."""
    return AgentNode(settings)


def charged(servicer, pacer):
    """The servicer, its handlers' CPU time stretched by D under a profile (as it is without one). The
    compute node's calls to its NIC (memory, counters, triggers) are not: on the seeds' platform they
    are the NIC's hardware path, paced where it is modeled (`scale.ops`)."""
    if pacer is None or pacer.dilation <= 1:
        return servicer
    return software.ChargedServicer(servicer, pacer, software.AGENT, exclude=frozenset(COMPUTE_METHODS))


class AgentNode:
    """The running agent (a kvtb.node.Node). Not thread-safe: one owner starts and stops it."""

    service = "smartnic"

    def __init__(self, settings: SmartNicSettings):
        self.settings = settings
        self.agent = Agent(settings)
        self.health: Health | None = None
        self.proxy: ComputeProxyServicer | None = None
        self.metrics: MetricsEndpoint | None = None
        self.addresses: dict[str, str] = {}
        self.calls = CallCounter()  # every call served, by method and caller (kvtb:agent_rpc_calls_total)
        self._loop = LoopThread("agent-grpc-loop")
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Connect to the storage nodes, bind the gRPC server and metrics, and serve."""
        self.agent.start()
        grpc_address = self._loop.start(self._serve)
        self.metrics = MetricsEndpoint(self.settings.metrics_address, lambda: agent_families(
            {**self.agent.snapshot(), "rpc_calls": self.calls.snapshot(),
             **(self.proxy.figures() if self.proxy else {})}))
        self.addresses = {"grpc": grpc_address, "metrics": self.metrics.address}
        self._loop.call(self.health.set_serving)

    async def _serve(self, started: concurrent.futures.Future, stop: asyncio.Event) -> None:
        s = self.settings
        security = Security.of(s.identity, s.credentials_dir, s.insecure)
        self._pool = concurrent.futures.ThreadPoolExecutor(s.grpc_workers, thread_name_prefix="agent-grpc")
        server = grpc.aio.server(migration_thread_pool=self._pool,
                                 options=server_options(max_message_bytes=64 << 20,
                                                        max_concurrent_streams=s.max_relayed_turns + CONTROL_CALLS),
                                 interceptors=[AioInterceptor(self.calls),
                                               AioInterceptor(Authorizer(access(s.compute_identity), security))])
        host = s.listen_address.rpartition(":")[0]
        port = add_port(server, s.listen_address, security)
        if port == 0:
            raise OSError(f"cannot listen on {s.listen_address}")
        self.proxy = ComputeProxyServicer(self.agent, security, host, port, s.compute_identity, s.replica,
                                          blocking=self._pool, max_turns=s.max_relayed_turns)
        # under a profile the control plane is software on both worlds: its CPU time stretched by D
        pacer = dilation.current()
        smartnic_pb2_grpc.add_SmartNicServicer_to_server(charged(SmartNicServicer(self.agent), pacer), server)
        smartnic_pb2_grpc.add_MatchActionServicer_to_server(charged(MatchActionServicer(self.agent), pacer), server)
        compute_pb2_grpc.add_ComputeNodeServicer_to_server(self.proxy, server)
        self.health = add_health_and_reflection(server, SERVICE_NAMES, aio=True)
        await server.start()
        stretch = await software.on_loop(pacer, software.AGENT)  # the turn relay, on this loop
        started.set_result(f"{host}:{port}")
        try:
            await stop.wait()
        finally:
            if stretch is not None:
                stretch.cancel()
            self.health.set_not_serving()
            await server.stop(grace=2)
            await self.proxy.close()

    def set_not_serving(self) -> None:
        """Health NOT_SERVING from now on, what stop() does first (from any thread; returns once set)."""
        async def not_serving() -> None:
            self.health.set_not_serving()
            await asyncio.sleep(0)  # the aio health servicer's update runs
        self._loop.run(not_serving(), timeout_s=10)

    def ready_extra(self) -> dict:
        return {"storage_nodes_up": sorted(self.agent.nodes.up())}

    def stop(self) -> None:
        """Stop serving, then close the agent (its regions, queue pairs and data path)."""
        self._loop.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.metrics:
            self.metrics.close()
        self.agent.close()
