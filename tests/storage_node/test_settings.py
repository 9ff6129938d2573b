"""Storage settings: defaults, validation, the access list from YAML and from the environment."""
import pytest

from compute_node.settings import ComputeSettings
from kvtb.credentials import AGENT_NQN, COMPUTE_NQN
from kvtb.settings import SettingsError, load_settings
from smartnic.settings import SmartNicSettings
from storage_node.settings import WILDCARD, StorageSettings


def test_defaults_follow_the_contract():
    s = StorageSettings()
    assert s.admin_address == "127.0.0.1:50061" and s.fabric_address == "tcp://127.0.0.1:55061"
    assert s.queue_depth == 128 and s.fsync and s.fabric_security == "auth"
    # this deployment's hosts, as their settings name them, never "*"
    assert dict(s.allowed_hosts) == {AGENT_NQN: WILDCARD, COMPUTE_NQN: WILDCARD}
    assert SmartNicSettings().host_nqn == AGENT_NQN and ComputeSettings().storage_host_nqn == COMPUTE_NQN
    assert s.allowed_namespaces("nqn.2026-11.org.evil:bob") is None
    assert StorageSettings(allowed_hosts={"*": "*"}).allowed_namespaces("nqn.any") == WILDCARD  # when written


def test_access_list_from_yaml_and_environment(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("storage:\n  allowed_hosts:\n    nqn.a: [1, 2]\n    nqn.b: '*'\n")
    s = load_settings(StorageSettings, "storage", cfg, environ={})
    assert s.allowed_namespaces("nqn.a") == (1, 2) and s.allowed_namespaces("nqn.b") == WILDCARD
    assert s.allowed_namespaces("nqn.c") is None
    env = {"KVTB_STORAGE_ALLOWED_HOSTS": '{"nqn.x": [3]}', "KVTB_STORAGE_QUEUE_DEPTH": "16"}
    s = load_settings(StorageSettings, "storage", cfg, environ=env)
    assert s.allowed_namespaces("nqn.x") == (3,) and s.allowed_namespaces("nqn.a") is None
    assert s.queue_depth == 16


def test_invalid_values_are_refused():
    with pytest.raises(SettingsError):
        load_settings(StorageSettings, "storage", None, environ={"KVTB_STORAGE_QUEUE_DEPTH": "0"})
    with pytest.raises(SettingsError):
        StorageSettings(namespaces=("tape",))
    with pytest.raises(SettingsError):
        load_settings(StorageSettings, "storage", None, environ={"KVTB_STORAGE_FABRIC_SECURITY": "tls"})
