"""deploy/stack_file.py: the swarm form of the compose file's replicas (no swarm)."""
from __future__ import annotations

import importlib.util

import yaml

from kvtb import credentials
from tests.deploy.conftest import ROOT

DEPLOY = ROOT / "deploy"


def _stack_module():
    spec = importlib.util.spec_from_file_location("deploy_stack_file", DEPLOY / "stack_file.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_pair_is_on_a_compute_host_and_the_second_is_scaled_from_zero():
    stack = _stack_module().stack_config(yaml.safe_load((DEPLOY / "docker-compose.yml").read_text()))
    services = stack["services"]
    for name in ("compute", "smartnic", "compute1", "smartnic1"):
        assert services[name]["deploy"]["placement"]["constraints"] == ["node.labels.kvtb.compute == true"], name
        assert services[name]["environment"]["KVTB_SHM_DIR"] == "/kvpool"
    for name in ("compute1", "smartnic1"):
        assert (services[name]["deploy"]["replicas"], services[name]["deploy"]["endpoint_mode"]) == (0, "dnsrr")
        assert "kvpool1:/kvpool" in services[name]["volumes"] and "profiles" not in services[name]
    assert "replicas" not in services["compute"]["deploy"]  # the first pair: one task, as before
    assert services["frontend"]["environment"]["KVTB_FRONTEND_REPLICAS"] == (
        "${KVTB_FRONTEND_REPLICAS:-replica-0=smartnic:50051=smartnic,replica-1=smartnic1:50051=smartnic-1}")


def test_each_service_gets_its_own_identitys_secrets():
    stack = _stack_module().stack_config(yaml.safe_load((DEPLOY / "docker-compose.yml").read_text()))
    targets = {name: {s["target"] for s in service.get("secrets", [])} for name, service in stack["services"].items()}
    assert targets["smartnic1"] == {"ca.crt", "smartnic-1.crt", "smartnic-1.key", "fabric.key", "kv-mac.key"}
    assert targets["compute1"] == {"ca.crt", "compute-1.crt", "compute-1.key", "fabric.key", "kv-mac.key"}
    assert targets["smartnic"] == {"ca.crt", "smartnic.crt", "smartnic.key", "fabric.key", "kv-mac.key"}
    assert targets["frontend"] == {"ca.crt", "frontend.crt", "frontend.key"}
    assert targets["client"] == set()


def test_every_secret_is_a_file_that_credentials_init_for_two_replicas_makes(tmp_path):
    stack = _stack_module().stack_config(yaml.safe_load((DEPLOY / "docker-compose.yml").read_text()))
    made = credentials.init(tmp_path / "credentials", credentials.deployment_identities(2))
    files = {secret["file"].removeprefix("./credentials/") for secret in stack["secrets"].values()}
    assert files and all((made / f).exists() for f in files), sorted(f for f in files if not (made / f).exists())


def test_the_monitoring_profile_stays_out_of_the_stack():
    """Prometheus (compose profile monitoring) is not deployed on a swarm, nor its volume; the rest is."""
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    stack = _stack_module().stack_config(compose)
    monitoring = {name for name, s in compose["services"].items() if "monitoring" in (s.get("profiles") or ())}
    assert monitoring == {"prometheus"}
    assert not monitoring & set(stack["services"]) and "prometheus-data" not in stack["volumes"]
    assert set(stack["services"]) == set(compose["services"]) - monitoring - {"credentials"}
