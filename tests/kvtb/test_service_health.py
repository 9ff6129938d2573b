"""Each service's gRPC server: health NOT_SERVING until ready (and on shutdown), reflection lists it."""
import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from kvtb.grpc_health import NOT_SERVING, SERVING, check
from smartnic import main as smartnic_main
from smartnic.settings import SmartNicSettings
from storage_node.server import StorageNode
from storage_node.settings import StorageSettings

HEALTH = "grpc.health.v1.Health"


def reflected_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        return set(ProtoReflectionDescriptorDatabase(channel).get_services())


def test_agent_is_not_serving_until_main_says_so():
    settings = SmartNicSettings(listen_address="127.0.0.1:0", metrics_address="127.0.0.1:0",
                                storage_nodes=("s0=127.0.0.1:9=tcp://127.0.0.1:9",))  # not running
    server, agent, health, proxy, address = smartnic_main.serve(settings)
    try:
        assert check(address) == NOT_SERVING
        assert check(address, "kvtb.compute.ComputeNode") == NOT_SERVING
        health.set_serving()
        assert check(address) == SERVING and check(address, "kvtb.smartnic.SmartNic") == SERVING
        assert {"kvtb.smartnic.SmartNic", "kvtb.smartnic.MatchAction", "kvtb.compute.ComputeNode",
                HEALTH} <= reflected_services(address)
        health.set_not_serving()
        assert check(address) == NOT_SERVING
    finally:
        server.stop(0).wait()
        proxy.close()
        agent.close()


def test_storage_node_serves_once_started_and_not_while_stopping(tmp_path):
    node = StorageNode(StorageSettings(data_dir=str(tmp_path), admin_address="127.0.0.1:0",
                                       fabric_address="tcp://127.0.0.1:0", namespace_size_bytes=1 << 20))
    address = node.start()["admin"]
    try:
        assert check(address) == SERVING and check(address, "kvtb.storage.StorageAdmin") == SERVING
        assert {"kvtb.storage.StorageAdmin", HEALTH} <= reflected_services(address)
        node.health.set_not_serving()  # what stop() does first
        assert check(address) == NOT_SERVING
    finally:
        node.stop()
