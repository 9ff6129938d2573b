"""Placement in containers: the compose file's cpuset and `cpus` per service, the stack file's `cpus`
only (swarm has no cpuset), and deploy/placement.py's assignments (no containers)."""
from __future__ import annotations

import importlib.util
import os

import pytest
import yaml

from tests.deploy.conftest import ROOT

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

DEPLOY = ROOT / "deploy"
SECTIONS = {"storage0": "STORAGE", "storage1": "STORAGE", "smartnic": "SMARTNIC", "compute": "COMPUTE",
            "frontend": "FRONTEND"}
PAIR_ONE = {"smartnic1": ("SMARTNIC", "SMARTNIC1"), "compute1": ("COMPUTE", "COMPUTE1")}  # setting, variable


def _placement_module():
    spec = importlib.util.spec_from_file_location("deploy_placement", DEPLOY / "placement.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_compose_service_takes_its_cpus_from_the_environment():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for name, section in SECTIONS.items():
        service = compose["services"][name]
        variable = f"KVTB_{section}_CPUS"
        assert service["environment"][variable] == f"${{{variable}:-}}", name  # empty by default: every CPU
        assert service["cpuset"] == f"${{{variable}:-}}", name


def test_the_stack_file_pins_through_the_environment_only():
    stack = yaml.safe_load((DEPLOY / "docker-stack.yml").read_text())
    for name, section in SECTIONS.items():
        service = stack["services"][name]
        assert "cpuset" not in service, name
        assert f"KVTB_{section}_CPUS" in service["environment"], name


def test_placement_script_assigns_each_section_its_plan():
    module = _placement_module()
    assert module.assignments("nic", "0-15") == {
        "KVTB_STORAGE_CPUS": "12-14", "KVTB_SMARTNIC_CPUS": "12-15", "KVTB_COMPUTE_CPUS": "0-11",
        "KVTB_FRONTEND_CPUS": "12-14", "KVTB_SMARTNIC_FASTPATH": "process", "KVTB_SMARTNIC_WATCHER_BUSY_POLL": "true",
        "KVTB_SMARTNIC_FASTPATH_CPUS": "15", "KVTB_SMARTNIC_WATCHER_NAP_US": "0"}
    shared = module.assignments("shared", "0-1")
    assert {v for k, v in shared.items() if k.endswith("_CPUS") and "FASTPATH" not in k} == {"0-1"}
    assert shared["KVTB_SMARTNIC_FASTPATH"] == "thread" and shared["KVTB_SMARTNIC_WATCHER_BUSY_POLL"] == "false"
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        module.assignments("nic", "3")


def test_placement_script_prints_what_make_up_passes_to_compose(capsys):
    module = _placement_module()
    assert module.main(["nic", "--cpus", "0-1"]) == 0
    assert capsys.readouterr().out.split() == ["KVTB_STORAGE_CPUS=1", "KVTB_SMARTNIC_CPUS=1",
                                               "KVTB_COMPUTE_CPUS=0", "KVTB_FRONTEND_CPUS=1",
                                               "KVTB_SMARTNIC_FASTPATH=process", "KVTB_SMARTNIC_WATCHER_BUSY_POLL=false",
                                               "KVTB_SMARTNIC_FASTPATH_CPUS=", "KVTB_SMARTNIC_WATCHER_NAP_US=1000"]
    assert module.main(["nic", "--cpus", "5"]) == 2
    assert "at least 2 CPUs" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/usr/bin/docker-compose"), reason="docker-compose is not installed")
def test_compose_accepts_an_empty_and_a_given_cpuset():
    import subprocess
    for env, want in (({}, ""), ({"KVTB_COMPUTE_CPUS": "0"}, "0")):
        out = subprocess.run(["docker-compose", "-f", str(DEPLOY / "docker-compose.yml"), "config"],
                             capture_output=True, text=True, timeout=60,
                             env={**{k: v for k, v in os.environ.items() if not k.endswith("_CPUS")}, **env})
        assert out.returncode == 0, out.stderr
        compute = yaml.safe_load(out.stdout)["services"]["compute"]
        assert compute["cpuset"] == want and compute["environment"]["KVTB_COMPUTE_CPUS"] == want


def test_the_second_pair_takes_its_own_cpus_from_the_environment():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for name, (section, variable) in PAIR_ONE.items():
        service = compose["services"][name]
        assert service["environment"][f"KVTB_{section}_CPUS"] == f"${{KVTB_{variable}_CPUS:-}}", name
        assert service["cpuset"] == f"${{KVTB_{variable}_CPUS:-}}", name
    fastpath = compose["services"]["smartnic1"]["environment"]["KVTB_SMARTNIC_FASTPATH_CPUS"]
    assert fastpath == "${KVTB_SMARTNIC1_FASTPATH_CPUS:-}"


def test_placement_script_splits_the_compute_cpus_between_two_pairs():
    module = _placement_module()
    two = module.assignments("shared", "0-1", replicas=2)
    assert (two["KVTB_COMPUTE_CPUS"], two["KVTB_COMPUTE1_CPUS"]) == ("0", "1")
    assert two["KVTB_SMARTNIC1_CPUS"] == two["KVTB_STORAGE_CPUS"] == "0-1"
    nic = module.assignments("nic", "0-15", replicas=2)  # NIC 12-15: 14 and 15 one fast path each
    assert (nic["KVTB_COMPUTE_CPUS"], nic["KVTB_COMPUTE1_CPUS"]) == ("0-5", "6-11")
    assert (nic["KVTB_SMARTNIC_FASTPATH_CPUS"], nic["KVTB_SMARTNIC1_FASTPATH_CPUS"]) == ("14", "15")
    assert nic["KVTB_SMARTNIC1_WATCHER_BUSY_POLL"] == "true"
    # every variable it prints is one the compose file reads
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert all(f"${{{key}:-" in compose for key in nic), [k for k in nic if f"${{{k}:-" not in compose]
