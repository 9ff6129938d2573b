"""`kvtb up`'s placement: the CPUs it gives each service it starts, and what it says about them
(no processes: Deployment._start is replaced by one that records each service's environment)."""
from __future__ import annotations

import json
import os
import types
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
        section = placement.section(name)
        self.ready = {"addresses": {"grpc": "h:1", "admin": "h:2", "fabric": "tcp://h:3"},
                      "cpus": env.get(f"KVTB_{section.upper()}_CPUS", "?")}
        if name == "compute":  # replica 0's
            self.ready["torch_threads"] = len(placement.parse_cpus(self.ready["cpus"]))


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    """Deployment(placement) -> the deployment, started with recording services."""
    monkeypatch.delenv(credentials.ENV_DIR, raising=False)
    for section in placement.SERVICES:
        monkeypatch.delenv(f"KVTB_{section.upper()}_CPUS", raising=False)
    monkeypatch.setattr(placement, "current_cpus", lambda: (0, 1, 2, 3, 4, 5, 6, 7))

    def make(placement_name: str | None, config: dict | None = None, replicas: int = 1) -> up.Deployment:
        path = tmp_path / "kvtb.yaml"
        path.write_text(yaml.safe_dump(config or {}))
        dep = up.Deployment(str(path), tmp_path / "data", None, 2, placement_name, replicas=replicas)

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
    assert compute.given["KVTB_COMPUTE_OFFLOAD_THREAD_CPUS"] == "6"  # its triggered stores: the NIC's work
    agent = next(p for p in dep.procs if p.name == "smartnic")  # the NIC's fast path: its own process, polling
    assert (agent.given["KVTB_SMARTNIC_FASTPATH"], agent.given["KVTB_SMARTNIC_WATCHER_BUSY_POLL"],
            agent.given["KVTB_SMARTNIC_FASTPATH_CPUS"]) == ("process", "true", "7")


def test_shared_gives_every_service_every_cpu(deployment):
    dep = deployment(None)
    assert dep.placement == "shared"
    assert set(dep.cpus().values()) == {"0-7"}
    compute = next(p for p in dep.procs if p.name == "compute")  # torch's threads free to move off a busy core
    assert compute.given["KVTB_COMPUTE_TORCH_BIND"] == "false"
    assert compute.given["KVTB_COMPUTE_OFFLOAD_THREAD_CPUS"] == ""  # the node's own CPUs
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


def test_one_replica_is_started_as_it_always_was(deployment):
    dep = deployment(None)
    assert [p.name for p in dep.procs] == ["storage-0", "storage-1", "smartnic", "compute", "frontend"]
    frontend = next(p for p in dep.procs if p.name == "frontend")
    assert "KVTB_FRONTEND_REPLICAS" not in frontend.given
    agent, compute = dep.replica_procs(0)
    assert not any(k in agent.given for k in ("KVTB_SMARTNIC_IDENTITY", "KVTB_SMARTNIC_REPLICA"))
    assert "KVTB_COMPUTE_IDENTITY" not in compute.given
    assert dep.replica_addresses() == {"replica-0": {"agent": "h:1", "compute": "h:1"}}
    with pytest.raises(IndexError, match="replicas 0 .. 0"):
        dep.replica_procs(1)


def test_each_replica_has_its_own_identities_hosts_and_ports(deployment, monkeypatch):
    for name in ("KVTB_SMARTNIC_LISTEN_ADDRESS", "KVTB_SMARTNIC_METRICS_ADDRESS", "KVTB_COMPUTE_LISTEN_ADDRESS",
                 "KVTB_COMPUTE_METRICS_ADDRESS", "KVTB_COMPUTE_ADVERTISE_ADDRESS", "KVTB_COMPUTE_NODE_NAME"):
        monkeypatch.delenv(name, raising=False)
    dep = deployment(None, {"compute": {"listen_address": "127.0.0.1:0"}}, replicas=3)
    assert [p.name for p in dep.procs] == ["storage-0", "storage-1", "smartnic", "compute", "smartnic-1",
                                           "compute-1", "smartnic-2", "compute-2", "frontend"]
    agent, compute = dep.replica_procs(2)
    assert {k: v for k, v in agent.given.items() if k in (
        "KVTB_SMARTNIC_IDENTITY", "KVTB_SMARTNIC_REPLICA", "KVTB_SMARTNIC_COMPUTE_IDENTITY", "KVTB_SMARTNIC_HOST_NQN",
        "KVTB_SMARTNIC_LISTEN_ADDRESS", "KVTB_SMARTNIC_METRICS_ADDRESS")} == {
        "KVTB_SMARTNIC_IDENTITY": "smartnic-2", "KVTB_SMARTNIC_REPLICA": "replica-2",
        "KVTB_SMARTNIC_COMPUTE_IDENTITY": "compute-2", "KVTB_SMARTNIC_HOST_NQN": "nqn.2026-11.org.kvtestbed:smartnic-2",
        "KVTB_SMARTNIC_LISTEN_ADDRESS": "127.0.0.1:50251", "KVTB_SMARTNIC_METRICS_ADDRESS": "127.0.0.1:9301"}
    assert compute.given["KVTB_COMPUTE_IDENTITY"] == "compute-2"
    assert compute.given["KVTB_COMPUTE_AGENT_IDENTITY"] == "smartnic-2"
    assert compute.given["KVTB_COMPUTE_STORAGE_HOST_NQN"] == "nqn.2026-11.org.kvtestbed:compute-2"
    assert compute.given["KVTB_COMPUTE_NODE_NAME"] == "compute0-2"  # its own KV pool region
    assert compute.given["KVTB_COMPUTE_LISTEN_ADDRESS"] == "127.0.0.1:0"  # any free port stays any
    assert compute.given["KVTB_COMPUTE_METRICS_ADDRESS"] == "127.0.0.1:9302"
    assert "KVTB_COMPUTE_ADVERTISE_ADDRESS" not in compute.given  # none: the bound address
    assert compute.given["KVTB_COMPUTE_AGENT_ADDRESS"] == "h:1"  # what its own agent announced
    first = dep.replica_procs(0)[0]
    assert first.given["KVTB_SMARTNIC_REPLICA"] == "replica-0" and "KVTB_SMARTNIC_IDENTITY" not in first.given
    frontend = next(p for p in dep.procs if p.name == "frontend")
    assert frontend.given["KVTB_FRONTEND_REPLICAS"] == "replica-0=h:1=smartnic,replica-1=h:1=smartnic-1,replica-2=h:1=smartnic-2"
    assert set(dep.replica_addresses()) == {"replica-0", "replica-1", "replica-2"}


def test_every_storage_node_allows_every_replicas_hosts(deployment):
    dep = deployment(None, replicas=2)
    for proc in dep.procs[:2]:
        hosts = json.loads(proc.given["KVTB_STORAGE_ALLOWED_HOSTS"])
        assert set(hosts) == {f"nqn.2026-11.org.kvtestbed:{name}-{i}" for name in ("smartnic", "compute")
                              for i in (0, 1)}


def test_the_credentials_cover_every_replica(deployment, tmp_path):
    deployment(None, replicas=2)
    made = tmp_path / "data" / "credentials"
    assert {f"{n}.crt" for n in ("smartnic-1", "compute-1", "smartnic", "compute")} <= {p.name for p in made.iterdir()}
    assert not (made / "smartnic-2.crt").exists()


def test_each_compute_node_gets_its_share_of_the_cpus(deployment, monkeypatch):
    monkeypatch.setattr(placement, "current_cpus", lambda: (0, 1))
    dep = deployment(None, replicas=2)  # shared on 2 CPUs: one each; the rest everywhere
    assert dep.cpus() == {"storage-0": "0-1", "storage-1": "0-1", "smartnic": "0-1", "compute": "0",
                          "smartnic-1": "0-1", "compute-1": "1", "frontend": "0-1"}
    dep = deployment("nic", replicas=2)  # one compute CPU: they share it; no fast path busy-polls the NIC's one
    assert dep.cpus()["compute"] == dep.cpus()["compute-1"] == "0"
    assert {p.given["KVTB_SMARTNIC_WATCHER_BUSY_POLL"] for p in dep.procs if p.name.startswith("smartnic")} == {"false"}


def test_replicas_on_eight_cpus_under_nic(deployment):
    dep = deployment("nic", replicas=2)
    assert (dep.cpus()["compute"], dep.cpus()["compute-1"]) == ("0-2", "3-5")
    # two NIC CPUs for two agents: no fast path has one to itself
    assert {p.given["KVTB_SMARTNIC_FASTPATH_CPUS"] for p in dep.procs if p.name.startswith("smartnic")} == {""}


def test_a_dead_replica_stops_nothing_a_dead_shared_service_stops_everything(deployment):
    dep = deployment(None, replicas=2)
    alive = {p.name: True for p in dep.procs}
    for proc in dep.procs:
        proc.alive = lambda name=proc.name: alive[name]
    assert dep.fatal_death() is None
    alive["compute-1"] = False
    assert dep.fatal_death() is None and list(dep.dead_replicas()) == ["replica-1"]
    alive["smartnic"] = False  # every replica lost a process: restarted, not the end
    assert dep.fatal_death() is None
    dep.given_up = {0, 1}  # every replica given up: nothing left to serve
    assert dep.fatal_death().name == "smartnic"
    dep.given_up = set()
    alive["storage-1"] = False
    assert dep.fatal_death().name == "storage-1"


class Supervised:
    """A deployment's processes alive or dead at will; each restart recorded (and alive again)."""

    def __init__(self, dep: up.Deployment, monkeypatch, fail: set[str] = frozenset()):
        self.dep, self.said, self.started, self.fail = dep, [], [], set(fail)
        self.alive = {p.name: True for p in dep.procs}
        for proc in dep.procs:
            proc.alive = lambda name=proc.name: self.alive[name]
            proc.stop = lambda name=proc.name: self.alive.__setitem__(name, False)

        def relaunch(proc, section, timeout_s):
            self.started.append(proc.name)
            if proc.name in self.fail:
                raise RuntimeError(f"{proc.name} exited with 1 before it was ready")
            self.alive[proc.name] = True
        monkeypatch.setattr(dep, "_relaunch", relaunch)

    def check(self, now: float):
        return self.dep.check(now, self.said.append)


def test_a_dead_compute_node_restarts_with_its_agent_after_the_policys_delay(deployment, monkeypatch):
    dep = deployment(None, replicas=2)
    sup = Supervised(dep, monkeypatch)
    dep.up_since = {0: 0.0, 1: 0.0}
    sup.alive["compute-1"] = False
    assert sup.check(100.0) is None
    assert sup.started == [] and dep.due == {1: 101.0}
    assert any(m.startswith("compute-1 of replica-1 exited") for m in sup.said)
    assert "restarting replica-1 in 1 s" in sup.said[-1] and "the other replicas keep serving" in sup.said[-1]
    assert sup.check(100.5) is None and sup.started == []  # not due yet
    assert sup.check(101.0) is None
    # the pair: the agent (alive) stopped first, then started again, then the compute node
    assert sup.started == ["smartnic-1", "compute-1"] and all(sup.alive.values())
    assert "replica-1 restarted (agent and compute node" in sup.said[-1]
    assert 1 in dep.up_since and not dep.due


def test_a_dead_agent_restarts_alone_its_compute_node_waits(deployment, monkeypatch):
    dep = deployment(None, replicas=2)
    sup = Supervised(dep, monkeypatch)
    sup.alive["smartnic"] = False
    sup.check(10.0)
    sup.check(11.0)
    assert sup.started == ["smartnic"]
    assert "replica-0 restarted (agent:" in sup.said[-1]


def test_the_delays_double_and_the_replica_is_given_up_after_max_restarts(deployment, monkeypatch):
    dep = deployment(None, replicas=2)
    dep.restart = [up.RestartPolicy(up.Limits(max_restarts=3)) for _ in range(2)]
    sup = Supervised(dep, monkeypatch, fail={"compute-1"})  # it never comes up again
    sup.alive["compute-1"] = False
    now, delays = 0.0, []
    while 1 not in dep.given_up:
        now += 0.5
        sup.check(now)
        if 1 in dep.due and (not delays or delays[-1][1] != dep.due[1]):
            delays.append((now, dep.due[1]))
    assert [round(due - at) for at, due in delays] == [1, 2, 4]
    assert sup.started.count("compute-1") == 3
    assert "giving up on replica-1: 3 restarts within 300 s (at most 3); 1 other replica(s) keep serving" in sup.said[-1]
    assert not sup.alive["smartnic-1"]  # the half that lived is stopped: it serves no one
    assert sup.check(now + 100) is None  # replica-0 serves on
    sup.alive["compute"] = False
    dep.restart[0] = up.RestartPolicy(up.Limits(max_restarts=0))
    assert sup.check(now + 101) is not None  # none left: everything stops
    assert "no replica left" in sup.said[-1]


def test_with_one_replica_a_dead_process_is_restarted_too(deployment, monkeypatch):
    dep = deployment(None)
    sup = Supervised(dep, monkeypatch)
    sup.alive["compute"] = False
    assert sup.check(0.0) is None and dep.due == {0: 1.0}
    assert "keep serving" not in sup.said[-1]
    sup.check(1.0)
    assert sup.started == ["smartnic", "compute"]
    sup.alive["frontend"] = False
    assert sup.check(2.0).name == "frontend"


class Dead:
    """A reaped process: its pid, no longer running."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, -9

    def poll(self):
        return self.returncode


def test_the_regions_of_a_dead_compute_node_are_removed_and_only_those(deployment, tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    dep = deployment(None, {"compute": {"node_name": "node7"}}, replicas=2)
    compute, compute1 = dep.replica_procs(0)[1], dep.replica_procs(1)[1]
    for proc, pid in ((compute, 4001), (compute1, 4002)):
        proc.env = {**proc.env, **proc.given, "KVTB_SHM_DIR": str(shm)}
        proc.proc = Dead(pid)
    made = shm / "kvtb-node7-4001"            # announced and named by the settings
    unannounced = shm / "kvtb-node7-1-4002"   # replica 1's, dead before its ready line
    other = shm / "kvtb-node7-4003"           # another process's
    outside = tmp_path / "kvtb-node7-4001"    # a claim outside the directory
    for path in (made, unannounced, other, outside):
        path.write_bytes(b"x")
    compute.ready = {"regions": [str(made), str(other), str(outside)]}
    assert dep.remove_regions(compute) == [str(made)]
    assert dep.remove_regions(compute1) == [str(unannounced)]
    assert other.exists() and outside.exists()
    assert dep.remove_regions(compute) == []  # once per process


def test_a_live_process_keeps_its_region(deployment, tmp_path):
    dep = deployment(None)
    compute = dep.replica_procs(0)[1]
    region = tmp_path / f"kvtb-compute0-{os.getpid()}"
    region.write_bytes(b"x")
    compute.env = {**compute.env, "KVTB_SHM_DIR": str(tmp_path)}
    compute.proc = types.SimpleNamespace(pid=os.getpid(), poll=lambda: None)
    compute.alive = lambda: True
    assert dep.remove_regions(compute) == [] and region.exists()


def test_up_parses_replicas():
    assert up.parse_args([]).replicas == 1
    assert up.parse_args(["--replicas", "8"]).replicas == 8
    for bad in ("0", "9"):
        with pytest.raises(SystemExit):
            up.parse_args(["--replicas", bad])
    with pytest.raises(ValueError, match="replicas must be a whole number 1 .. 8"):
        up.Deployment(None, Path("/d"), None, 2, replicas=0)
    assert up.parse_args([]).max_restarts == 5 and up.parse_args(["--max-restarts", "0"]).max_restarts == 0
    with pytest.raises(SystemExit):
        up.parse_args(["--max-restarts", "-1"])
