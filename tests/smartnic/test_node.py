"""The agent as a node: serve(settings) -> start(), its health and reflection, stop()."""
from kvtb.grpc_health import NOT_SERVING, SERVING, check
from smartnic.node import serve
from smartnic.settings import SmartNicSettings
from tests.kvtb.grpc_reflection import HEALTH, reflected_services


def test_agent_serves_once_started_and_not_while_stopping():
    node = serve(SmartNicSettings(listen_address="127.0.0.1:0", metrics_address="127.0.0.1:0",
                                  storage_nodes=("s0=127.0.0.1:9=tcp://127.0.0.1:9",)))  # not running
    node.start()
    try:
        address = node.addresses["grpc"]
        assert set(node.addresses) == {"grpc", "metrics"}
        assert check(address) == SERVING and check(address, "kvtb.smartnic.SmartNic") == SERVING
        assert check(address, "kvtb.compute.ComputeNode") == SERVING
        assert {"kvtb.smartnic.SmartNic", "kvtb.smartnic.MatchAction", "kvtb.compute.ComputeNode",
                HEALTH} <= reflected_services(address)
        node.health.set_not_serving()  # what stop() does first
        assert check(address) == NOT_SERVING
    finally:
        node.stop()
