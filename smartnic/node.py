"""The SmartNIC agent as a service: the agent, its gRPC server (SmartNic, MatchAction and the
ComputeNode proxy) and its metrics (`serve`)."""
from __future__ import annotations

import concurrent.futures
import logging

import grpc

from kvtb.grpc_health import Health, add_health_and_reflection
from kvtb.metrics import MetricsEndpoint
from kvtb.rpc import Authorizer, CallCounter, Security, add_port, server_options
from kvtb.service_metrics import agent_families
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
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


class AgentNode:
    """The running agent (a kvtb.node.Node). Not thread-safe: one owner starts and stops it."""

    service = "smartnic"

    def __init__(self, settings: SmartNicSettings):
        self.settings = settings
        self.agent = Agent(settings)
        self.server: grpc.Server | None = None
        self.health: Health | None = None
        self.proxy: ComputeProxyServicer | None = None
        self.metrics: MetricsEndpoint | None = None
        self.addresses: dict[str, str] = {}
        self.calls = CallCounter()  # every call served, by method and caller (kvtb:agent_rpc_calls_total)

    def start(self) -> None:
        """Connect to the storage nodes, bind the gRPC server and metrics, and serve."""
        self.agent.start()
        s = self.settings
        security = Security.of(s.identity, s.credentials_dir, s.insecure)
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(s.grpc_workers),
                                  options=server_options(max_message_bytes=64 << 20),
                                  interceptors=[self.calls, Authorizer(access(s.compute_identity), security)])
        host = s.listen_address.rpartition(":")[0]
        port = add_port(self.server, s.listen_address, security)
        if port == 0:
            raise OSError(f"cannot listen on {s.listen_address}")
        self.proxy = ComputeProxyServicer(self.agent, security, host, port, s.compute_identity, s.replica)
        smartnic_pb2_grpc.add_SmartNicServicer_to_server(SmartNicServicer(self.agent), self.server)
        smartnic_pb2_grpc.add_MatchActionServicer_to_server(MatchActionServicer(self.agent), self.server)
        compute_pb2_grpc.add_ComputeNodeServicer_to_server(self.proxy, self.server)
        self.health = add_health_and_reflection(self.server, SERVICE_NAMES)
        self.server.start()
        self.metrics = MetricsEndpoint(s.metrics_address, lambda: agent_families(
            {**self.agent.snapshot(), "rpc_calls": self.calls.snapshot()}))
        self.addresses = {"grpc": f"{host}:{port}", "metrics": self.metrics.address}
        self.health.set_serving()

    def ready_extra(self) -> dict:
        return {"storage_nodes_up": sorted(self.agent.nodes.up())}

    def stop(self) -> None:
        """Stop serving, then close the agent (its regions, queue pairs and data path)."""
        if self.health:
            self.health.set_not_serving()
        if self.server:
            self.server.stop(grace=2).wait()
        if self.proxy:
            self.proxy.close()
        if self.metrics:
            self.metrics.close()
        self.agent.close()
