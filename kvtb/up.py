"""`kvtb up`: every service of the testbed as local processes, until Ctrl-C or SIGTERM.

Starts the storage nodes, the SmartNIC agent, the compute node and the chat frontend in that
order, each with `kvtb serve NAME` on the CPUs its placement gives it (`--placement shared|nic`,
kvtb.placement; a service whose `cpus` its settings give keeps those), waits for each one's ready line and gRPC health, wires the
addresses each one announced into the next (so a config with port 0 works too), prints where
each listens and then a ready line of its own (`KVTB_READY {"service": "up", ...}`).
Stops them all, last started first, on Ctrl-C, SIGTERM, or when a storage node or the frontend dies.

`--replicas N` starts N replicas, an agent and its compute node each, sharing the storage nodes:
replica 0's are `smartnic` and `compute` (as with one), replica i's `smartnic-i` and `compute-i`, each
with its own identity (kvtb.credentials.replica_identities), fabric host NQN, ports (replica 0's plus
100 i; port 0 stays 0) and share of the compute CPUs (kvtb.placement.shares); every storage node
allows every replica's hosts, and the frontend routes over them all (KVTB_FRONTEND_REPLICAS).

Replicas heal (`check`, every 0.5 s): a replica's process that dies is reported, the others keep serving
(the frontend fails over), and the replica is restarted after a delay of its restart policy
(kvtb.restart_policy: 1 s, 2 s, 4 s ... up to 30 s; after --max-restarts restarts within 5 minutes it is
given up, and said so), on the addresses it announced, so the frontend's health probe takes it back into
the rotation. Its compute node dead: the pair restarts (the agent, stopped first, maps the dead node's
region); only its agent dead: the agent alone (its compute node waits for it, pool kept, and registers
again). A storage node or the frontend dying, or every replica given up, stops everything (they are
not restarted). A restart blocks the loop until the replica is SERVING (the compute node loads its model).

Regions (kvtb.regions): the /dev/shm file of a compute node's KV pool (named in its ready line, and
kvtb-<node_name>-<pid> by its settings) is removed once its process is dead (kill -9 included): as soon as
the loop sees it, before the replica restarts, and when `kvtb up` stops. (`kvtb up` itself killed with -9
removes nothing; a node of the same name reclaims it when it starts: hostmem.region_reclaim.)

Private by default (kvtb.private): the data directory is 0700, and what an older run left in the parts
of it `kvtb up` makes (logs, the frontend's, each storage node's) is narrowed to 0700 and 0600.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kvtb import credentials, placement, regions
from kvtb.credentials import AGENT_NQN, COMPUTE_NQN, MAX_REPLICAS, replica_identities, replica_nqns
from kvtb.grpc_health import wait_serving
from kvtb.launch import ServiceProcess, announce_ready, kvtb_argv
from kvtb.private import make_private, private_dir, private_tree
from kvtb.restart_policy import Limits, RestartPolicy
from kvtb.rpc import OPERATOR, Security
from kvtb.settings import SettingsError, read_config_file

logger = logging.getLogger(__name__)

REPO_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "kvtb.yaml"
POLICIES = ("triggered", "cpu", "resident", "recompute")
DEFAULT_STORAGE = {"admin_address": "127.0.0.1:50061", "fabric_address": "tcp://127.0.0.1:55061",
                   "metrics_address": "127.0.0.1:9103"}
# Replica 0's addresses where neither the environment nor the config file gives them (the settings' own
# defaults); replica i listens on each port + REPLICA_PORT_STRIDE * i.
DEFAULT_REPLICA = {"smartnic": {"listen_address": "127.0.0.1:50051", "metrics_address": "127.0.0.1:9101"},
                   "compute": {"listen_address": "127.0.0.1:50071", "metrics_address": "127.0.0.1:9102",
                               "advertise_address": "", "node_name": "compute0"}}
REPLICA_PORT_STRIDE = 100


class Stopped(Exception):
    """Ctrl-C or SIGTERM arrived."""


def shift_port(address: str, by: int) -> str:
    """'tcp://h:55061', 1 -> 'tcp://h:55062'; port 0 (any free port) stays 0."""
    head, _, port = address.rpartition(":")
    return f"{head}:{int(port) + by if int(port) else 0}"


def deployment_hosts(config: dict[str, Any], environ=os.environ, replicas: int = 1) -> dict[str, str]:
    """The storage fabric's hosts as this deployment's settings name them (the agent's `host_nqn`, the
    compute node's `storage_host_nqn`; environment over file over default), then replica i's for every
    i >= 1 (kvtb.credentials.replica_nqns): every storage node's allow list unless its section gives one."""
    agent = environ.get("KVTB_SMARTNIC_HOST_NQN") or (config.get("smartnic") or {}).get("host_nqn") or AGENT_NQN
    compute = (environ.get("KVTB_COMPUTE_STORAGE_HOST_NQN") or (config.get("compute") or {}).get("storage_host_nqn")
               or COMPUTE_NQN)
    hosts = {agent: "*", compute: "*"}
    for i in range(1, replicas):
        hosts.update(dict.fromkeys(replica_nqns(i), "*"))
    return hosts


def replica_name(index: int) -> str:
    """The frontend's name of replica `index` (the agent's `replica` setting)."""
    return f"replica-{index}"


def _setting(config: dict[str, Any], environ, section: str, field: str) -> str:
    """A setting's value as a service would read it: environment over config file over default."""
    return str(environ.get(f"KVTB_{section.upper()}_{field.upper()}") or (config.get(section) or {}).get(field)
               or DEFAULT_REPLICA[section][field])


def replica_agent_env(index: int, replicas: int, config: dict[str, Any], environ=os.environ) -> dict[str, str]:
    """What makes an agent replica `index`'s own: its name, identity and its compute node's, its fabric
    host NQN and its ports (replica 0 with no other replica: nothing, as a deployment of one always was)."""
    if replicas == 1:
        return {}
    env = {"KVTB_SMARTNIC_REPLICA": replica_name(index)}
    if index == 0:
        return env
    agent, compute = replica_identities(index)
    env.update({"KVTB_SMARTNIC_IDENTITY": agent, "KVTB_SMARTNIC_COMPUTE_IDENTITY": compute,
                "KVTB_SMARTNIC_HOST_NQN": replica_nqns(index)[0]})
    for field in ("listen_address", "metrics_address"):
        env[f"KVTB_SMARTNIC_{field.upper()}"] = shift_port(_setting(config, environ, "smartnic", field),
                                                           REPLICA_PORT_STRIDE * index)
    return env


def replica_compute_env(index: int, config: dict[str, Any], environ=os.environ) -> dict[str, str]:
    """What makes a compute node replica `index`'s own: its identity and its agent's, its fabric host NQN
    (the `cpu` policy's), node name (its KV pool's region) and ports (replica 0: nothing)."""
    if index == 0:
        return {}
    agent, compute = replica_identities(index)
    env = {"KVTB_COMPUTE_IDENTITY": compute, "KVTB_COMPUTE_AGENT_IDENTITY": agent,
           "KVTB_COMPUTE_STORAGE_HOST_NQN": replica_nqns(index)[1],
           "KVTB_COMPUTE_NODE_NAME": f"{_setting(config, environ, 'compute', 'node_name')}-{index}"}
    for field in ("listen_address", "metrics_address", "advertise_address"):
        base = _setting(config, environ, "compute", field)
        if base:
            env[f"KVTB_COMPUTE_{field.upper()}"] = shift_port(base, REPLICA_PORT_STRIDE * index)
    return env


def replicas_env(agents: list[ServiceProcess]) -> dict[str, str]:
    """The frontend's replicas, "replica-i=ADDRESS=IDENTITY" each, from the agents as they announced
    themselves (agents[i] is replica i's); none with one agent (the frontend's default: its agent_address)."""
    if len(agents) <= 1:
        return {}
    return {"KVTB_FRONTEND_REPLICAS": ",".join(f"{replica_name(i)}={agent.addresses['grpc']}={replica_identities(i)[0]}"
                                               for i, agent in enumerate(agents))}


def storage_env(index: int, section: dict[str, Any], data_dir: Path,
                hosts: dict[str, str] | None = None) -> dict[str, str]:
    """Environment overrides that make storage node `index` its own node (addresses, data, names), and
    its allow list `hosts` when the section gives none."""
    name = f"storage-{index}"
    env = {"KVTB_STORAGE_NODE_NAME": name, "KVTB_STORAGE_DATA_DIR": str(data_dir / name),
           "KVTB_STORAGE_SUBSYSTEM_NQN": f"nqn.2026-11.org.kvtestbed:{name}"}
    if hosts and "allowed_hosts" not in section:
        env["KVTB_STORAGE_ALLOWED_HOSTS"] = json.dumps(hosts)
    for field in ("admin_address", "fabric_address", "metrics_address"):
        base = section.get(field) or DEFAULT_STORAGE[field]
        env[f"KVTB_STORAGE_{field.upper()}"] = shift_port(base, index)
    return env


def agent_env(storage: list[ServiceProcess]) -> dict[str, str]:
    """The agent's storage nodes, as the storage nodes announced them."""
    nodes = [f"{p.name}={p.addresses['admin']}={p.addresses['fabric']}" for p in storage]
    return {"KVTB_SMARTNIC_STORAGE_NODES": ",".join(nodes)}


def compute_env(agent: ServiceProcess, storage: list[ServiceProcess]) -> dict[str, str]:
    return {"KVTB_COMPUTE_AGENT_ADDRESS": agent.addresses["grpc"],
            "KVTB_COMPUTE_STORAGE_FABRIC_ADDRESSES": ",".join(p.addresses["fabric"] for p in storage)}


def frontend_env(agent: ServiceProcess, storage: list[ServiceProcess], data_dir: Path) -> dict[str, str]:
    return {"KVTB_FRONTEND_AGENT_ADDRESS": agent.addresses["grpc"],
            "KVTB_FRONTEND_DATA_DIR": str(data_dir / "frontend"),
            "KVTB_FRONTEND_STORAGE_ADMIN_ADDRESSES": ",".join(p.addresses["admin"] for p in storage)}


def placement_name(requested: str | None, config: dict[str, Any]) -> str:
    """The placement asked for, else the config file's top-level `placement`, else shared."""
    name = requested or config.get("placement") or "shared"
    if name not in placement.PLACEMENTS:
        raise SettingsError(f"unknown placement {name!r}: one of {', '.join(placement.PLACEMENTS)}")
    return str(name)


def cpus_env(service: str, plan: dict[str, tuple[int, ...]], config: dict[str, Any],
             environ=os.environ) -> dict[str, str]:
    """KVTB_<SECTION>_CPUS for a service of the placement's plan ("compute-1": section compute), unless its
    environment or its config section sets its `cpus` already (an operator's own layout wins)."""
    section = placement.section(service)
    variable = f"KVTB_{section.upper()}_CPUS"
    if environ.get(variable) or str((config.get(section) or {}).get("cpus") or "").strip():
        return {}
    return {variable: placement.format_cpus(plan[service])}


def agent_placement_env(name: str, plan: dict[str, tuple[int, ...]], config: dict[str, Any],
                        environ=os.environ, agent: str = "smartnic") -> dict[str, str]:
    """The fast path settings of the plan's agent `agent` (smartnic, smartnic-1, ...) for a placement
    (kvtb.placement.agent_settings_in), each unless its environment or config section sets it already."""
    section = config.get("smartnic") or {}
    given = placement.agent_settings_in(name, plan, agent) if agent in plan else placement.agent_settings(name)
    return {f"KVTB_SMARTNIC_{field.upper()}": value for field, value in given.items()
            if not environ.get(f"KVTB_SMARTNIC_{field.upper()}") and field not in section}


def compute_placement_env(name: str, plan: dict[str, tuple[int, ...]], config: dict[str, Any],
                          environ=os.environ) -> dict[str, str]:
    """The compute node's placement settings (kvtb.placement.compute_settings_in: its offload thread's
    CPUs), each unless its environment or config section sets it already."""
    section = config.get("compute") or {}
    return {f"KVTB_COMPUTE_{field.upper()}": value for field, value in placement.compute_settings_in(name, plan).items()
            if not environ.get(f"KVTB_COMPUTE_{field.upper()}") and field not in section}


def unbound_env(name: str, config: dict[str, Any], environ=os.environ) -> dict[str, str]:
    """Under `shared` torch's threads are not bound one per CPU (every service runs on every CPU: a thread
    bound to a core another service keeps busy could not move away), unless the operator says so."""
    if name != "shared" or environ.get("KVTB_COMPUTE_TORCH_BIND") or "torch_bind" in (config.get("compute") or {}):
        return {}
    return {"KVTB_COMPUTE_TORCH_BIND": "false"}


def grpc_address(proc: ServiceProcess) -> str:
    return proc.addresses.get("grpc") or proc.addresses["admin"]


class Deployment:
    """The running services, in start order. Owned by the main thread."""

    def __init__(self, config: str | None, data_dir: Path, policy: str | None, storage_nodes: int,
                 placement: str | None = None, replicas: int = 1, limits: Limits = Limits()):
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be a whole number 1 .. {MAX_REPLICAS}, got {replicas!r}")
        self.replicas = replicas
        self.restart = [RestartPolicy(limits) for _ in range(replicas)]  # each replica's
        self.up_since: dict[int, float] = {}  # replica -> when it (last) came up (time.monotonic())
        self.due: dict[int, float] = {}       # replica -> when its restart is due
        self.given_up: set[int] = set()       # replicas no longer restarted
        self.cleaned: set[Any] = set()        # the (dead) processes (Popen) whose regions were removed
        self.config_data: dict[str, Any] = {}
        self.config = config
        self.data_dir = data_dir
        self.policy = policy
        self.storage_nodes = storage_nodes
        self.placement = placement   # None: the config file's `placement`, else shared (at start)
        self.plan: dict[str, tuple[int, ...]] = {}
        self.procs: list[ServiceProcess] = []

    def _start(self, name: str, args: list[str], env: dict[str, str], timeout_s: float) -> ServiceProcess:
        argv = kvtb_argv("serve", *args, *(["--config", self.config] if self.config else []))
        env = {credentials.ENV_DIR: str(self.credentials_dir), **env}
        proc = ServiceProcess(name, argv, self.data_dir / "logs" / f"{name}.log", env=env, die_with_parent=True)
        self.procs.append(proc)
        logger.info("starting %s", name)
        proc.start(timeout_s=timeout_s)
        if not wait_serving(grpc_address(proc), timeout_s=timeout_s, security=self.security(name)):
            raise RuntimeError(f"{name} announced {proc.addresses} but is not SERVING; "
                               f"log {proc.log_path}:\n{proc.log_tail()}")
        return proc

    @property
    def credentials_dir(self) -> Path:
        """$KVTB_CREDENTIALS_DIR when set (a deployment's own), else DATA_DIR/credentials."""
        return Path(os.environ.get(credentials.ENV_DIR) or self.data_dir / "credentials")

    def security(self, name: str) -> Security:
        """How `kvtb up` checks a service's health: the frontend's user port is plain (tokens)."""
        return Security.off() if name == "frontend" else Security.of(OPERATOR, str(self.credentials_dir))

    def make_private(self) -> None:
        """The data directory 0700; its logs, the frontend's and the storage nodes' directories narrowed to
        0700 with their files 0600 (an older run may have left them readable)."""
        private_dir(self.data_dir)
        for part in ("logs", "frontend", *(f"storage-{i}" for i in range(self.storage_nodes))):
            if (self.data_dir / part).is_dir():
                private_tree(self.data_dir / part)

    def start(self, section: dict[str, Any]) -> None:
        """Make the data directory private and the deployment's credentials (the first time), then start
        every service in order."""
        config = self.config_data = read_config_file(self.config) if self.config else {}
        self.make_private()
        self.placement = placement_name(self.placement, config)  # plan below; ValueError: nic on one CPU
        self.plan = placement.plan(self.placement, replicas=self.replicas)
        credentials.init(self.credentials_dir, credentials.deployment_identities(self.replicas))
        hosts = deployment_hosts(config, replicas=self.replicas)

        def env(service: str, wiring: dict[str, str]) -> dict[str, str]:
            kind = placement.section(service)
            return {**cpus_env(service, self.plan, config), **wiring,
                    **(agent_placement_env(self.placement, self.plan, config, agent=service) if kind == "smartnic" else {}),
                    **(unbound_env(self.placement, config) if kind == "compute" else {}),
                    **(compute_placement_env(self.placement, self.plan, config) if kind == "compute" else {})}

        storage = [self._start(f"storage-{i}", ["storage"],
                               env("storage", storage_env(i, section, self.data_dir, hosts)), 60)
                   for i in range(self.storage_nodes)]
        policy = ["--policy", self.policy] if self.policy else []
        agents = []
        for i in range(self.replicas):
            agent_name, compute_name = placement.replica_services(i)
            agent = self._start(agent_name, ["smartnic"], env(agent_name, {
                **agent_env(storage), **replica_agent_env(i, self.replicas, config)}), 60)
            self._start(compute_name, ["compute", *policy], env(compute_name, {
                **compute_env(agent, storage), **replica_compute_env(i, config)}), 600)
            agents.append(agent)
            self.up_since[i] = time.monotonic()
        self._start("frontend", ["frontend"], env("frontend", {
            **frontend_env(agents[0], storage, self.data_dir), **replicas_env(agents)}), 120)

    def replica_procs(self, index: int) -> tuple[ServiceProcess, ServiceProcess]:
        """(agent, compute node) of replica `index`, as started."""
        if not 0 <= index < self.replicas:
            raise IndexError(f"replica {index}: this deployment has replicas 0 .. {self.replicas - 1}")
        agent, compute = placement.replica_services(index)
        by_name = {p.name: p for p in self.procs}
        if agent not in by_name or compute not in by_name:
            raise LookupError(f"replica {index} was not started")
        return by_name[agent], by_name[compute]

    def replica_addresses(self) -> dict[str, dict[str, str]]:
        """replica name -> {"agent": its gRPC address, "compute": its compute node's}, as they announced them."""
        out = {}
        for i in range(self.replicas):
            try:
                agent, compute = self.replica_procs(i)
            except LookupError:
                continue
            out[replica_name(i)] = {"agent": grpc_address(agent), "compute": grpc_address(compute)}
        return out

    def addresses(self) -> dict[str, Any]:
        return {p.name: p.addresses for p in self.procs}

    def policy_in_use(self) -> str:
        """The KV policy the compute node announced."""
        compute = next((p for p in self.procs if p.name == "compute"), None)
        return str(compute.ready.get("policy", "?")) if compute else "?"

    def cpus(self) -> dict[str, str]:
        """service -> the CPUs it announced it runs on."""
        return {p.name: str(p.ready.get("cpus", "?")) for p in self.procs}

    def torch_threads(self) -> int | None:
        """The compute node's torch threads, as it announced them (None before it started)."""
        compute = next((p for p in self.procs if p.name == "compute"), None)
        return compute.ready.get("torch_threads") if compute else None

    def pids(self) -> dict[str, int]:
        """service -> its process id (what a test or an operator signals to fail one)."""
        return {p.name: p.proc.pid for p in self.procs if p.proc is not None}

    def dead_replicas(self) -> dict[str, list[ServiceProcess]]:
        """replica name -> its processes that died (only replicas with one)."""
        out = {}
        for i in range(self.replicas):
            try:
                dead = [p for p in self.replica_procs(i) if not p.alive()]
            except LookupError:
                continue
            if dead:
                out[replica_name(i)] = dead
        return out

    def fatal_death(self) -> ServiceProcess | None:
        """The death that stops everything, if any: a storage node's or the frontend's, or a replica's once
        every replica is given up (dead, no restart left: none left to serve)."""
        dead = [p for p in self.procs if not p.alive()]
        shared = [p for p in dead if placement.section(p.name) in ("storage", "frontend")]
        if shared:
            return shared[0]
        if dead and len(self.given_up) == self.replicas:
            return dead[0]
        return None

    # regions: what a compute node made in /dev/shm, removed once it is dead

    def regions_of(self, proc: ServiceProcess) -> list[str]:
        """The regions proc's process made (or would have: it may have died before its ready line): those it
        announced, and its compute node's by name (kvtb-<node_name>-<pid>)."""
        if proc.proc is None:
            return []
        paths = [str(p) for p in proc.ready.get("regions", []) if isinstance(p, str)]
        if placement.section(proc.name) == "compute":
            node = _setting(self.config_data, proc.env, "compute", "node_name")
            paths.append(str(regions.region_path(node, proc.proc.pid, proc.env)))
        return paths

    def remove_regions(self, proc: ServiceProcess) -> list[str]:
        """Remove the regions of proc's process once it is dead (none while it lives); those removed."""
        if proc.proc is None or proc.alive() or proc.proc in self.cleaned:
            return []
        self.cleaned.add(proc.proc)
        removed = regions.remove_dead(self.regions_of(proc), proc.proc.pid, regions.shm_dir(proc.env))
        for path in removed:
            logger.info("removed %s, the region %s (pid %d) left", path, proc.name, proc.proc.pid)
        return removed

    # restarts

    def check(self, now: float, say=None) -> ServiceProcess | None:
        """One look at the processes (the supervisor's loop, every 0.5 s): the regions of the dead removed, a
        replica with a dead process scheduled for a restart by its policy (or given up), a restart that is
        due done; the death that stops everything, if any (fatal_death)."""
        say = say or _say
        for proc in self.procs:
            self.remove_regions(proc)
        if (fatal := self.fatal_death()) is not None:
            return fatal
        for i in range(self.replicas):
            if i in self.given_up:
                continue
            try:
                procs = self.replica_procs(i)
            except LookupError:
                continue
            if i in self.due:
                if now >= self.due[i]:
                    self.restart_replica(i, say)
                continue
            dead = [p for p in procs if not p.alive()]
            if not dead:
                continue
            for proc in dead:
                say(f"{proc.name} of {replica_name(i)} exited with {proc.proc.returncode if proc.proc else None}; "
                    f"log {proc.log_path}:\n{proc.log_tail(20)}")
            delay = self.restart[i].died(now, self.up_since.pop(i, None))
            if delay is None:
                self.given_up.add(i)
                others = self.replicas - len(self.given_up)
                say(f"giving up on {replica_name(i)}: {self.restart[i].describe()}; "
                    + (f"{others} other replica(s) keep serving" if others else "no replica left"))
                for proc in procs:  # the half of the pair still running serves no one
                    proc.stop()
                    self.remove_regions(proc)
                continue
            self.due[i] = now + delay
            say(f"restarting {replica_name(i)} in {delay:.0f} s ({self.restart[i].describe()})"
                + ("; the other replicas keep serving" if self.replicas > 1 else ""))
        return self.fatal_death()

    def restart_replica(self, index: int, say=None) -> bool:
        """Start replica index's dead processes again, on the addresses they announced (the frontend and the
        compute node dial those): its compute node dead, the pair (the agent, stopped first if it lives,
        maps the dead node's region and holds its registration); only its agent dead, the agent (its compute
        node waits for it with its pool kept, and registers again: compute_node.node). Whether it is up."""
        say = say or _say
        self.due.pop(index, None)
        agent, compute = self.replica_procs(index)
        started = time.monotonic()
        pair = not compute.alive()
        try:
            if pair:
                if agent.alive():
                    agent.stop()
                self.remove_regions(agent)
                self.remove_regions(compute)
            self._relaunch(agent, "smartnic", 60)
            if pair:
                compute.env["KVTB_COMPUTE_AGENT_ADDRESS"] = grpc_address(agent)
                self._relaunch(compute, "compute", 600)
        except (RuntimeError, TimeoutError, OSError) as exc:
            say(f"restarting {replica_name(index)} failed: {exc}")
            return False
        self.up_since[index] = time.monotonic()
        pids = ", ".join(f"{p.name} {p.proc.pid}" for p in ((agent, compute) if pair else (agent,)) if p.proc)
        say(f"{replica_name(index)} restarted ({'agent and compute node' if pair else 'agent'}: pids {pids}) in "
            f"{self.up_since[index] - started:.1f} s; the frontend takes it back once its health probe passes")
        return True

    def _relaunch(self, proc: ServiceProcess, section: str, timeout_s: float) -> None:
        """Start proc again on the addresses it announced; killed if it does not come up SERVING."""
        before = proc.addresses
        if "grpc" in before:
            proc.env[f"KVTB_{section.upper()}_LISTEN_ADDRESS"] = before["grpc"]
        if "metrics" in before:
            proc.env[f"KVTB_{section.upper()}_METRICS_ADDRESS"] = before["metrics"]
        logger.info("starting %s again", proc.name)
        try:
            proc.start(timeout_s=timeout_s)
            if not wait_serving(grpc_address(proc), timeout_s=timeout_s, security=self.security(proc.name)):
                raise RuntimeError(f"{proc.name} announced {proc.addresses} but is not SERVING; "
                                   f"log {proc.log_path}:\n{proc.log_tail()}")
        except BaseException:
            if proc.alive():
                proc.kill()
            if not proc.addresses:
                proc.ready = {"addresses": before}  # the addresses to come back on next time
            raise

    def stop(self) -> None:
        for proc in reversed(self.procs):
            code = proc.stop()
            logger.info("%s stopped (exit code %s)", proc.name, code)
        for proc in self.procs:  # whatever killed them (a kill -9 leaves a compute node's region)
            self.remove_regions(proc)


def _say(message: str) -> None:
    print(f"kvtb up: {message}", file=sys.stderr, flush=True)


def describe(deployment: Deployment) -> list[str]:
    """Where each service listens, for the terminal."""
    lines = [(f"kvtb up: all services ready (policy {deployment.policy_in_use()}, "
              f"placement {deployment.placement}, data in {deployment.data_dir})")]
    for proc in deployment.procs:
        where = "  ".join(f"{k} {v}" for k, v in proc.addresses.items())
        threads = f", {proc.ready['torch_threads']} torch threads" if "torch_threads" in proc.ready else ""
        lines.append(f"  {proc.name:<10} {where}   cpus {proc.ready.get('cpus', '?')}{threads}   "
                     f"log {proc.log_path}")
    http = next((p.addresses["http"] for p in deployment.procs if "http" in p.addresses), "")
    if http:
        lines.append(f"OpenAI API: http://{http}/v1 (X-Session-Id continues a context); "
                     "metrics: each service's `metrics` address, at /metrics")
    lines.append("Chat with `kvtb chat`, see the figures with `kvtb stats`; Ctrl-C stops everything.")
    return lines


def _raise_stopped(*_: object) -> None:
    raise Stopped()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb up", description="Run every service locally.")
    parser.add_argument("--policy", choices=POLICIES, help="KV policy (default: the config's)")
    parser.add_argument("--data-dir", default="var", help="where the services keep data and logs")
    parser.add_argument("--config", help="config file (default: $KVTB_CONFIG, else deploy/kvtb.yaml)")
    parser.add_argument("--placement", choices=placement.PLACEMENTS,
                        help="where the services run: shared (every one on every CPU) or nic (the agent, the "
                             "storage nodes and the frontend on the last quarter of the CPUs, at least one; the "
                             "compute node on the rest); default: the config's `placement`, else shared")
    parser.add_argument("--storage-nodes", type=int, default=2, choices=range(1, 10), metavar="N",
                        help="how many storage nodes (default 2)")
    parser.add_argument("--replicas", type=int, default=1, choices=range(1, MAX_REPLICAS + 1), metavar="N",
                        help=f"how many replicas, an agent and its compute node each, sharing the storage nodes "
                             f"(1 .. {MAX_REPLICAS}, default 1); the frontend routes over them")
    parser.add_argument("--max-restarts", type=int, default=Limits.max_restarts, metavar="N",
                        help=f"restarts of a replica within {Limits.window_s:.0f} s before it is given up "
                             f"(default {Limits.max_restarts}; 0: a dead replica stays dead)")
    args = parser.parse_args(argv)
    if args.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0, got {args.max_restarts}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    make_private()  # the services inherit it
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s kvtb up: %(message)s")
    config = args.config or os.environ.get("KVTB_CONFIG")
    if config is None and REPO_CONFIG.exists():
        config = str(REPO_CONFIG)
    try:
        section = read_config_file(config).get("storage") or {}
    except SettingsError as exc:
        print(f"kvtb up: {exc}", file=sys.stderr)
        return 2
    deployment = Deployment(config and str(Path(config).resolve()), Path(args.data_dir).resolve(),
                            args.policy, args.storage_nodes, args.placement, args.replicas,
                            Limits(max_restarts=args.max_restarts))
    signal.signal(signal.SIGINT, _raise_stopped)
    signal.signal(signal.SIGTERM, _raise_stopped)
    code = 0
    try:
        deployment.start(section)
        print("\n".join(describe(deployment)), flush=True)
        announce_ready("up", {p.name: grpc_address(p) for p in deployment.procs},
                       services=deployment.addresses(), policy=deployment.policy_in_use(),
                       placement=deployment.placement, cpus=deployment.cpus(),
                       torch_threads=deployment.torch_threads(), replicas=deployment.replica_addresses(),
                       pids=deployment.pids())
        while (dead := deployment.check(time.monotonic())) is None:
            time.sleep(0.5)
        why = ("every replica is given up" if len(deployment.given_up) == deployment.replicas
               else f"{dead.name} exited with {dead.proc.returncode if dead.proc else None}")
        print(f"kvtb up: {why}; stopping everything; log {dead.log_path}:\n{dead.log_tail(20)}", file=sys.stderr)
        code = 1
    except Stopped:
        logger.info("stopping")
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:  # ValueError: a placement not possible
        print(f"kvtb up: {exc}", file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        deployment.stop()
    return code
