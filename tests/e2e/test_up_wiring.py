"""`kvtb up`'s wiring of one service's announced addresses into the next (no processes)."""
import json
from pathlib import Path

from kvtb import up
from kvtb.launch import ServiceProcess


def announced(name: str, **addresses: str) -> ServiceProcess:
    proc = ServiceProcess(name, [], "/dev/null")
    proc.ready = {"addresses": addresses}
    return proc


def test_shift_port_keeps_any_free_port():
    assert up.shift_port("tcp://127.0.0.1:55061", 1) == "tcp://127.0.0.1:55062"
    assert up.shift_port("127.0.0.1:0", 1) == "127.0.0.1:0"


def test_second_storage_node_gets_its_own_addresses_and_data():
    env = up.storage_env(1, {"admin_address": "127.0.0.1:50061"}, Path("/d"))
    assert env == {"KVTB_STORAGE_NODE_NAME": "storage-1", "KVTB_STORAGE_DATA_DIR": "/d/storage-1",
                   "KVTB_STORAGE_SUBSYSTEM_NQN": "nqn.2026-11.org.kvtestbed:storage-1",
                   "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:50062",
                   "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:55062",
                   "KVTB_STORAGE_METRICS_ADDRESS": "127.0.0.1:9104"}


def test_storage_nodes_allow_the_deployments_hosts_as_its_settings_name_them():
    assert up.deployment_hosts({}, environ={}) == {"nqn.2026-11.org.kvtestbed:smartnic-0": "*",
                                                   "nqn.2026-11.org.kvtestbed:compute-0": "*"}
    config = {"smartnic": {"host_nqn": "nqn.x:agent"}, "compute": {"storage_host_nqn": "nqn.x:compute"}}
    hosts = up.deployment_hosts(config, environ={"KVTB_SMARTNIC_HOST_NQN": "nqn.y:agent"})
    assert hosts == {"nqn.y:agent": "*", "nqn.x:compute": "*"}
    env = up.storage_env(0, {}, Path("/d"), hosts)
    assert json.loads(env["KVTB_STORAGE_ALLOWED_HOSTS"]) == hosts
    assert "KVTB_STORAGE_ALLOWED_HOSTS" not in up.storage_env(0, {"allowed_hosts": {"*": "*"}}, Path("/d"), hosts)


def test_announced_addresses_flow_to_the_next_services():
    storage = [announced("storage-0", admin="h:1", fabric="tcp://h:2"),
               announced("storage-1", admin="h:3", fabric="tcp://h:4")]
    agent = announced("smartnic", grpc="h:5")
    assert up.agent_env(storage) == {
        "KVTB_SMARTNIC_STORAGE_NODES": "storage-0=h:1=tcp://h:2,storage-1=h:3=tcp://h:4"}
    assert up.compute_env(agent, storage) == {"KVTB_COMPUTE_AGENT_ADDRESS": "h:5",
                                              "KVTB_COMPUTE_STORAGE_FABRIC_ADDRESSES": "tcp://h:2,tcp://h:4"}
    assert up.frontend_env(agent, storage, Path("/d")) == {
        "KVTB_FRONTEND_AGENT_ADDRESS": "h:5", "KVTB_FRONTEND_DATA_DIR": "/d/frontend",
        "KVTB_FRONTEND_STORAGE_ADMIN_ADDRESSES": "h:1,h:3"}


def test_default_config_loads_for_every_service():
    from chat_frontend.settings import FrontendSettings
    from kvtb.settings import load_settings
    cfg = up.REPO_CONFIG
    frontend = load_settings(FrontendSettings, "frontend", cfg, environ={})
    assert frontend.listen_address == "127.0.0.1:50050" and frontend.users["demo"] == "demo-token"
    from compute_node.settings import ComputeSettings
    from smartnic.settings import SmartNicSettings
    from storage_node.settings import StorageSettings
    assert load_settings(StorageSettings, "storage", cfg, environ={}).admin_address == "127.0.0.1:50061"
    nic = load_settings(SmartNicSettings, "smartnic", cfg, environ={})
    assert nic.listen_address == "127.0.0.1:50051"
    # storage is bounded by default: LRU (and the idle timer) past 2 GiB, every block admitted
    assert (nic.capacity_high_bytes, nic.capacity_low_bytes) == (2 << 30, 3 << 29)
    assert (nic.eviction_policy, nic.admission) == ("both", "always")
    assert load_settings(ComputeSettings, "compute", cfg, environ={}).key_salt == nic.salt


def test_the_containers_config_bounds_storage_too():
    from kvtb.settings import load_settings
    from smartnic.settings import SmartNicSettings
    nic = load_settings(SmartNicSettings, "smartnic", up.REPO_CONFIG.with_name("kvtb.compose.yaml"), environ={})
    assert (nic.capacity_high_bytes, nic.capacity_low_bytes, nic.eviction_policy) == (2 << 30, 3 << 29, "both")
