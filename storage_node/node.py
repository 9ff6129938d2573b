"""The storage node: subsystem, I/O workers, fabric front end, admin gRPC server and metrics (`serve`)."""
from __future__ import annotations

import logging
from concurrent import futures

import grpc

from fabric.auth import FabricSecurity
from kvtb.grpc_health import Health, add_health_and_reflection
from kvtb.metrics import MetricsEndpoint
from kvtb.rpc import MAX_MESSAGE_BYTES, Authorizer, Security, add_port, server_options
from kvtb.service_metrics import storage_families
from kvtb_proto import storage_admin_pb2, storage_admin_pb2_grpc
from storage_node.admin_servicer import StorageAdminServicer
from storage_node.commands import CommandProcessor
from storage_node.fabric_server import RCV_HWM, FabricServer
from storage_node.settings import StorageSettings
from storage_node.stats import Stats
from storage_node.subsystem import Subsystem

logger = logging.getLogger(__name__)

ADMIN_SERVICE = storage_admin_pb2.DESCRIPTOR.services_by_name["StorageAdmin"].full_name
# Who may call what on the admin port (the operator may call everything): the frontend gathers
# the system's figures for `kvtb stats`.
ADMIN_ACCESS = {f"/{ADMIN_SERVICE}/Stats": {"frontend"}}
# The admin port's bounds: its requests are a few hundred bytes (1 MiB is ample), its metadata a
# certificate's worth, and calls beyond 64 at once are refused RESOURCE_EXHAUSTED rather than queued.
ADMIN_MAX_MESSAGE_BYTES = 1 << 20
ADMIN_MAX_CONCURRENT_RPCS = 64
# requests of 1 MiB at most (replies as gRPC's default, 4 MiB), and the deployment's other bounds
ADMIN_OPTIONS = server_options(ADMIN_MAX_MESSAGE_BYTES, max_send_bytes=MAX_MESSAGE_BYTES)


def serve(settings: StorageSettings) -> StorageNode:
    """The storage node of these settings, not started yet."""
    return StorageNode(settings)


class StorageNode:
    """One running storage node (a kvtb.node.Node). start() binds and serves; stop() drains and closes.

    Not thread-safe: one owner starts and stops it.
    """

    service = "storage"

    def __init__(self, settings: StorageSettings):
        self.settings = settings
        self.stats = Stats()
        self.subsystem = Subsystem(settings)
        self.executor: futures.ThreadPoolExecutor | None = None
        self.fabric: FabricServer | None = None
        self.grpc_server: grpc.Server | None = None
        self.health: Health | None = None
        self.metrics: MetricsEndpoint | None = None
        self.addresses: dict[str, str] = {}

    def start(self) -> dict[str, str]:
        """Open the namespaces, bind both endpoints and metrics, and serve; return the bound addresses."""
        fabric_security = FabricSecurity.for_target(self.settings.fabric_security, self.settings.credentials_dir)
        self.subsystem.open()
        self.executor = futures.ThreadPoolExecutor(self.settings.io_threads, thread_name_prefix="io")
        self.fabric = FabricServer(self.settings.fabric_address, security=fabric_security,
                                   max_frame_bytes=self.settings.max_frame_bytes,
                                   rcv_hwm=RCV_HWM)
        processor = CommandProcessor(self.subsystem, self.executor, self.fabric.post, self.stats, fabric_security)
        security = Security.of("storage", self.settings.credentials_dir, self.settings.insecure)
        self.grpc_server = grpc.server(futures.ThreadPoolExecutor(4, thread_name_prefix="admin"),
                                       interceptors=[Authorizer(ADMIN_ACCESS, security)], options=ADMIN_OPTIONS,
                                       maximum_concurrent_rpcs=ADMIN_MAX_CONCURRENT_RPCS)
        storage_admin_pb2_grpc.add_StorageAdminServicer_to_server(
            StorageAdminServicer(self.subsystem, self.stats, self.fabric.address), self.grpc_server)
        self.health = add_health_and_reflection(self.grpc_server, [ADMIN_SERVICE])
        host = self.settings.admin_address.rsplit(":", 1)[0]
        port = add_port(self.grpc_server, self.settings.admin_address, security)
        if port == 0:
            raise OSError(f"cannot bind the admin address {self.settings.admin_address}")
        self.grpc_server.start()
        self.fabric.start(processor)
        self.health.set_serving()
        self.addresses = {"admin": f"{host}:{port}", "fabric": self.fabric.address}
        self.metrics = MetricsEndpoint(self.settings.metrics_address,
                                       lambda: storage_families(self.stats.snapshot(), self.namespace_usage()))
        self.addresses["metrics"] = self.metrics.address
        logger.info("storage node %s serving: %s", self.settings.node_name, self.addresses)
        return self.addresses

    def ready_extra(self) -> dict:
        return {"node": self.settings.node_name, "subsystem_nqn": self.settings.subsystem_nqn,
                "fabric_security": self.settings.fabric_security}

    def namespace_usage(self) -> list[tuple[int, int, int]]:
        """(nsid, used bytes, keys) of each namespace."""
        return [(nsid, ns.used_bytes, ns.key_count) for nsid, ns in sorted(self.subsystem.namespaces.items())]

    def stop(self) -> None:
        """Stop taking capsules, finish what runs, commit what is queued, close the files."""
        if self.health:
            self.health.set_not_serving()
        if self.fabric:
            self.fabric.stop()  # no new capsules; replies still in flight are dropped
        if self.grpc_server:
            self.grpc_server.stop(grace=1.0).wait()
        if self.executor:
            self.executor.shutdown(wait=True)
        if self.metrics:
            self.metrics.close()
        self.subsystem.close()  # commits what was queued, then closes the files
        logger.info("storage node %s stopped", self.settings.node_name)
