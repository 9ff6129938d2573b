"""`kvtb up`'s placement: the CPUs it gives each service it starts, and what it says about them
(no processes: Deployment._start is replaced by one that records each service's environment)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvtb import credentials, placement, up
from kvtb.launch import ServiceProcess
from kvtb.settings import SettingsError


def test_placement_is_the_flag_else_the_config_else_shared():
    assert up.placement_name("nic", {"placement": "shared"}) == "nic"
    assert up.placement_name(None, {"placement": "nic"}) == "nic"
    assert up.placement_name(None, {}) == "shared"
    with pytest.raises(SettingsError, match="unknown placement 'spread'"):
        up.placement_name(None, {"placement": "spread"})


def test_cpus_env_follows_the_plan_unless_the_service_sets_its_own():
    plan = placement.plan("nic", (0, 1, 2, 3))
    assert up.cpus_env("compute", plan, {}, environ={}) == {"KVTB_COMPUTE_CPUS": "0-2"}
    assert up.cpus_env("smartnic", plan, {}, environ={}) == {"KVTB_SMARTNIC_CPUS": "3"}
    assert up.cpus_env("compute", plan, {"compute": {"cpus": "1"}}, environ={}) == {}
    assert up.cpus_env("compute", plan, {}, environ={"KVTB_COMPUTE_CPUS": "2"}) == {}
    assert up.cpus_env("compute", plan, {"compute": {"cpus": ""}}, environ={}) == {"KVTB_COMPUTE_CPUS": "0-2"}


class Recorded(ServiceProcess):
    """A service that is never started: it announces the CPUs its environment gave it."""

    def __init__(self, name: str, env: dict[str, str]):
        super().__init__(name, [], "/dev/null")
        self.given = env
        section = "storage" if name.startswith("storage") else name
        self.ready = {"addresses": {"grpc": "h:1", "admin": "h:2", "fabric": "tcp://h:3"},
                      "cpus": env.get(f"KVTB_{section.upper()}_CPUS", "?")}
        if name == "compute":
            self.ready["torch_threads"] = len(placement.parse_cpus(self.ready["cpus"]))


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    """Deployment(placement) -> the deployment, started with recording services."""
    monkeypatch.delenv(credentials.ENV_DIR, raising=False)
    for section in placement.SERVICES:
        monkeypatch.delenv(f"KVTB_{section.upper()}_CPUS", raising=False)
    monkeypatch.setattr(placement, "current_cpus", lambda: (0, 1, 2, 3, 4, 5, 6, 7))

    def make(placement_name: str | None, config: dict | None = None) -> up.Deployment:
        path = tmp_path / "kvtb.yaml"
        path.write_text(yaml.safe_dump(config or {}))
        dep = up.Deployment(str(path), tmp_path / "data", None, 2, placement_name)

        def start(name: str, args: list[str], env: dict[str, str], timeout_s: float) -> ServiceProcess:
            proc = Recorded(name, env)
            dep.procs.append(proc)
            return proc

        monkeypatch.setattr(dep, "_start", start)
        dep.start({})
        return dep
    return make


def test_nic_gives_the_nic_services_the_last_quarter(deployment):
    dep = deployment("nic")
    assert dep.placement == "nic"
    assert dep.cpus() == {"storage-0": "6", "storage-1": "6", "smartnic": "6-7", "compute": "0-5",
                          "frontend": "6"}
    compute = next(p for p in dep.procs if p.name == "compute")
    assert compute.given["KVTB_COMPUTE_CPUS"] == "0-5"
    assert "KVTB_COMPUTE_AGENT_ADDRESS" in compute.given  # the wiring is still there
    assert dep.torch_threads() == 6
    agent = next(p for p in dep.procs if p.name == "smartnic")  # the NIC's fast path: its own process, polling
    assert (agent.given["KVTB_SMARTNIC_FASTPATH"], agent.given["KVTB_SMARTNIC_WATCHER_BUSY_POLL"],
            agent.given["KVTB_SMARTNIC_FASTPATH_CPUS"]) == ("process", "true", "7")


def test_shared_gives_every_service_every_cpu(deployment):
    dep = deployment(None)
    assert dep.placement == "shared"
    assert set(dep.cpus().values()) == {"0-7"}
    compute = next(p for p in dep.procs if p.name == "compute")  # torch's threads free to move off a busy core
    assert compute.given["KVTB_COMPUTE_TORCH_BIND"] == "false"
    agent = next(p for p in dep.procs if p.name == "smartnic")  # no spinning watcher on the forward's cores
    assert (agent.given["KVTB_SMARTNIC_FASTPATH"], agent.given["KVTB_SMARTNIC_WATCHER_BUSY_POLL"]) == ("thread", "false")


def test_the_config_names_the_placement_and_a_section_keeps_its_own_cpus(deployment):
    dep = deployment(None, {"placement": "nic", "frontend": {"cpus": "5"}})
    assert dep.placement == "nic"
    frontend = next(p for p in dep.procs if p.name == "frontend")
    assert "KVTB_FRONTEND_CPUS" not in frontend.given  # the service reads its own `cpus: 5`
    assert dep.cpus()["compute"] == "0-5"


def test_nic_on_one_cpu_is_refused_before_anything_starts(deployment, monkeypatch):
    monkeypatch.setattr(placement, "current_cpus", lambda: (0,))
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        deployment("nic")


def test_describe_says_the_placement_and_each_services_cpus(deployment):
    lines = up.describe(deployment("nic"))
    assert "placement nic" in lines[0]
    compute = next(line for line in lines if line.strip().startswith("compute"))
    assert "cpus 0-5, 6 torch threads" in compute
    smartnic = next(line for line in lines if line.strip().startswith("smartnic"))
    assert "cpus 6-7" in smartnic


def test_up_parses_placement():
    assert up.parse_args(["--placement", "nic"]).placement == "nic"
    assert up.parse_args([]).placement is None
    with pytest.raises(SystemExit):
        up.parse_args(["--placement", "spread"])


def test_the_repo_config_names_no_placement_or_a_known_one():
    config = yaml.safe_load(Path(up.REPO_CONFIG).read_text())
    assert config.get("placement", "shared") in placement.PLACEMENTS
