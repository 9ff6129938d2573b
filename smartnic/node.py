"""The SmartNIC agent as a service: the agent, its gRPC server (SmartNic, MatchAction and the
ComputeNode proxy) and its metrics (`serve`)."""
from __future__ import annotations

import concurrent.futures
import logging

import grpc

from kvtb.grpc_health import Health, add_health_and_reflection
from kvtb.metrics import MetricsEndpoint
from kvtb.service_metrics import agent_families
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
from smartnic.agent import Agent
from smartnic.compute_proxy_servicer import ComputeProxyServicer
from smartnic.match_action_servicer import MatchActionServicer
from smartnic.settings import SmartNicSettings
from smartnic.smartnic_servicer import SmartNicServicer

logger = logging.getLogger(__name__)

SERVICE_NAMES = [smartnic_pb2.DESCRIPTOR.services_by_name["SmartNic"].full_name,
                 smartnic_pb2.DESCRIPTOR.services_by_name["MatchAction"].full_name,
                 compute_pb2.DESCRIPTOR.services_by_name["ComputeNode"].full_name]


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

    def start(self) -> None:
        """Connect to the storage nodes, bind the gRPC server and metrics, and serve."""
        self.agent.start()
        s = self.settings
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(s.grpc_workers),
                                  options=[("grpc.max_receive_message_length", 64 << 20),
                                           ("grpc.max_send_message_length", 64 << 20)])
        host = s.listen_address.rpartition(":")[0]
        port = self.server.add_insecure_port(s.listen_address)
        if port == 0:
            raise OSError(f"cannot listen on {s.listen_address}")
        self.proxy = ComputeProxyServicer(self.agent, host, port)
        smartnic_pb2_grpc.add_SmartNicServicer_to_server(SmartNicServicer(self.agent), self.server)
        smartnic_pb2_grpc.add_MatchActionServicer_to_server(MatchActionServicer(self.agent), self.server)
        compute_pb2_grpc.add_ComputeNodeServicer_to_server(self.proxy, self.server)
        self.health = add_health_and_reflection(self.server, SERVICE_NAMES)
        self.server.start()
        self.metrics = MetricsEndpoint(s.metrics_address, lambda: agent_families(self.agent.snapshot()))
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
