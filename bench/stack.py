"""The services a benchmark runs against, on free ports, in a data directory.

`Stack`: a config with every address on port 0 (the ready lines carry the real ones); storage,
agent, compute node and frontend started with `kvtb up`'s `Deployment` and all stopped when the
`with` block ends, also on an error or Ctrl-C. With `replicas=N`, N pairs of agent and compute node
share the storage nodes behind the one frontend (`kvtb up --replicas N`); `replica_channel(i)` calls
replica i's agent as the operator, so a turn can be pinned to a replica whatever the frontend's
routing. `start_storage`: one storage node process alone.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import resource
import shutil
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.results import record_placement
from fabric.auth import FabricSecurity
from fabric.client import FabricClient
from kvtb import credentials, private
from kvtb.credentials import AGENT_NQN, COMPUTE_NQN, replica_identities
from kvtb.launch import ServiceProcess, kvtb_argv
from kvtb.rpc import OPERATOR, Security, channel
from kvtb.up import Deployment
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc

logger = logging.getLogger(__name__)

SALT = "kvtb-bench-salt"
BENCH_NQN = "nqn.2026-11.org.kvtestbed:bench"  # the benchmarks' own fabric host (start_storage allows it)


def use_credentials(data_dir: Path) -> Path:
    """The run's deployment credentials (made in data_dir the first time, as `kvtb up` makes them),
    for this process and every service it starts; a directory already chosen is kept."""
    if not os.environ.get(credentials.ENV_DIR):
        os.environ[credentials.ENV_DIR] = str(credentials.init(Path(data_dir) / "credentials"))
    return Path(os.environ[credentials.ENV_DIR])


def operator_channel(address: str, peer: str, credentials_dir: str | os.PathLike | None = None) -> grpc.Channel:
    """A channel to a service of this run as its operator (mutual TLS), with the credentials in
    credentials_dir (default: this process's, $KVTB_CREDENTIALS_DIR)."""
    return channel(address, Security.of(OPERATOR, "" if credentials_dir is None else str(credentials_dir)),
                   peer=peer)


def start_storage(data_dir: Path, name: str, **settings: object) -> ServiceProcess:
    """A storage node process on free ports, its data and log under data_dir; settings are
    StorageSettings fields (namespace_size_bytes=...), given as KVTB_STORAGE_* variables. Its allow
    list, unless given: the deployment's agent and compute node, and the benchmarks' own host."""
    log = data_dir / f"storage-{name}.log"
    use_credentials(data_dir)
    settings.setdefault("allowed_hosts", json.dumps({AGENT_NQN: "*", COMPUTE_NQN: "*", BENCH_NQN: "*"}))
    proc = ServiceProcess(f"storage-{name}", kvtb_argv("serve", "storage"), log, env={
        "KVTB_STORAGE_NODE_NAME": name, "KVTB_STORAGE_DATA_DIR": str(data_dir / f"storage-{name}"),
        "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0", "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0",
        "KVTB_STORAGE_METRICS_ADDRESS": "127.0.0.1:0",
        **{f"KVTB_STORAGE_{key.upper()}": str(value) for key, value in settings.items()}}, die_with_parent=True)
    try:
        proc.start(timeout_s=60)
    except BaseException:  # e.g. SystemExit from SIGTERM while it started: it must not outlive us
        proc.stop()
        raise
    return proc


def bench_client(address: str, mode: str = "auth", **kwargs) -> FabricClient:
    """A fabric client of the benchmarks' own host, authenticating as `mode` says (not connected yet)."""
    return FabricClient(address, BENCH_NQN, security=FabricSecurity.for_host(mode, "", BENCH_NQN), **kwargs)


def bench_users(count: int) -> dict[str, str]:
    """user name -> bearer token for `count` benchmark users (u0, u1, ...)."""
    return {f"u{i}": f"u{i}-token" for i in range(count)}


def bench_config(*, pool_tokens: int = 32768, max_context_tokens: int = 4096, users: int = 4,
                 max_new_tokens: int = 16, smartnic: dict[str, Any] | None = None,
                 compute: dict[str, Any] | None = None, frontend: dict[str, Any] | None = None) -> dict:
    """A config with every address on port 0 and the given sizes; extra keys per section."""
    free = "127.0.0.1:0"
    return {
        "storage": {"admin_address": free, "fabric_address": "tcp://127.0.0.1:0", "metrics_address": free,
                    "namespace_size_bytes": 8 << 30},
        "smartnic": {"listen_address": free, "metrics_address": free, "salt": SALT, **(smartnic or {})},
        "compute": {"listen_address": free, "metrics_address": free, "pool_tokens": pool_tokens,
                    "max_context_tokens": max_context_tokens, "key_salt": SALT, **(compute or {})},
        "frontend": {"listen_address": free, "http_address": free, "metrics_address": free,
                     "users": bench_users(users),
                     "max_new_tokens_default": max_new_tokens, "max_new_tokens_cap": 1024,
                     # the stock admission (every place to a user alone, no quotas), a patient wait
                     "queue_timeout_s": 600.0,
                     **(frontend or {})},
    }


def service_of(process: str) -> str:
    """The service a process of a stack is: storage-0 -> storage; a replica's process keeps its name."""
    return process if process.startswith(("smartnic", "compute")) else process.split("-")[0]


class Stack:
    """Every service as a local process; a context manager that always stops them.

    Not thread-safe: one owner starts and stops it; the addresses may be read from any thread.
    """

    def __init__(self, data_dir: str | Path, config: dict[str, Any], *, policy: str = "triggered",
                 storage_nodes: int = 1, keep_data: bool = False, placement: str = "shared",
                 replicas: int = 1):
        if replicas < 1:
            raise ValueError(f"a stack needs at least one replica, not {replicas}")
        self.data_dir = Path(data_dir).resolve()
        self.config = copy.deepcopy(config)
        self.policy = policy
        self.placement = placement  # kvtb.placement: shared or nic (the result's machine record says it)
        self.keep_data = keep_data
        self.replicas = replicas
        self.config_path = self.data_dir / "kvtb.yaml"
        self.deployment = Deployment(str(self.config_path), self.data_dir, policy, storage_nodes, placement,
                                     replicas=replicas)

    def __enter__(self) -> Stack:
        private.data_dir(self.data_dir)  # 0700, its config 0600: it holds the deployment's salt
        with private.open_private(self.config_path, "w") as f:
            f.write(yaml.safe_dump(self.config))
        try:
            self.deployment.start(self.config.get("storage") or {})
        except BaseException:
            self.stop(failed=True)
            raise
        logger.info("stack up in %s (placement %s, cpus %s): %s", self.data_dir, self.placement,
                    self.deployment.cpus(), self.deployment.addresses())
        record_placement(self.placement, self.service_cpus(), self.deployment.torch_threads())
        return self

    def service_cpus(self) -> dict[str, str]:
        """service (storage, smartnic, compute, frontend; a replica i >= 1's smartnic-i and compute-i)
        -> the CPUs it announced it runs on."""
        return {service_of(name): cpus for name, cpus in self.deployment.cpus().items()}

    def __exit__(self, exc_type, *exc: object) -> None:
        self.stop(failed=exc_type is not None)

    def stop(self, failed: bool = False) -> None:
        """Stop every service (last started first). Unless keep_data, remove data_dir (the run's
        own directory); after a failure only the stored data, keeping the logs to look at."""
        self.deployment.stop()
        if self.keep_data:
            return
        if not failed:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            return
        for proc in self.deployment.procs:
            if proc.name.startswith("storage-"):
                shutil.rmtree(self.data_dir / proc.name, ignore_errors=True)
        logger.warning("the services' logs are kept in %s", self.data_dir / "logs")

    def address(self, service: str, kind: str = "grpc") -> str:
        """A service's announced address ('storage-0', 'smartnic', 'compute', 'frontend')."""
        for proc in self.deployment.procs:
            if proc.name == service:
                return proc.addresses[kind]
        raise KeyError(service)

    @property
    def frontend(self) -> str:
        return self.address("frontend")

    @property
    def agent(self) -> str:
        return self.address("smartnic")

    def token(self, user: str) -> str:
        return self.config["frontend"]["users"][user]

    def agent_channel(self) -> grpc.Channel:
        """A channel to the agent (replica 0's) as this deployment's operator (mutual TLS)."""
        return self.replica_channel(0)

    def replica_agent(self, i: int) -> str:
        """Replica i's agent's gRPC address."""
        return self.deployment.replica_procs(i)[0].addresses["grpc"]

    def compute_threads(self) -> dict[str, int | None]:
        """replica name -> its compute node's torch threads, as it announced them."""
        return {f"replica-{i}": self.deployment.replica_procs(i)[1].ready.get("torch_threads")
                for i in range(self.replicas)}

    def replica_channel(self, i: int) -> grpc.Channel:
        """A channel to replica i's agent as this deployment's operator: its ComputeNode service serves
        turns on replica i alone, whatever the frontend's routing."""
        return channel(self.replica_agent(i), Security.of(OPERATOR, str(self.deployment.credentials_dir)),
                       peer=replica_identities(i)[0])

    def compute_stub(self, channel: grpc.Channel) -> compute_pb2_grpc.ComputeNodeStub:
        """The ComputeNode service as the agent serves it (turns pass its match-action table)."""
        return compute_pb2_grpc.ComputeNodeStub(channel)

    def agent_stats(self) -> smartnic_pb2.StatsResponse:
        """The agent's counters (hits, misses, evictions, bytes stored)."""
        with self.agent_channel() as ch:
            return smartnic_pb2_grpc.SmartNicStub(ch).Stats(smartnic_pb2.StatsRequest(), timeout=10)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system, s) each service process has used so far, and this process's as
        "client" (the benchmark's own load): Linux's /proc; {} elsewhere."""
        out = {proc.name: proc.cpu_seconds() for proc in self.deployment.procs}
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out["client"] = usage.ru_utime + usage.ru_stime
        return {name: seconds for name, seconds in out.items() if seconds is not None}

    def compute_stats(self, replica: int = 0, timeout_s: float = 10.0) -> compute_pb2.ComputeStatsResponse:
        """Replica `replica`'s compute node's counters (through its agent)."""
        with self.replica_channel(replica) as ch:
            return compute_pb2_grpc.ComputeNodeStub(ch).Stats(compute_pb2.ComputeStatsRequest(),
                                                              timeout=timeout_s)
