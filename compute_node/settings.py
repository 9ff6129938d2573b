"""The compute node's settings: one frozen dataclass, section `compute` of the config file."""
from __future__ import annotations

import dataclasses
import os

from fabric.auth import COMPUTE_NQN
from fabric.auth import MODES as FABRIC_SECURITY_MODES

POLICIES = ("triggered", "cpu", "resident", "recompute")


def _default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "kvtestbed", "smollm2-135m-instruct")


@dataclasses.dataclass(frozen=True)
class ComputeSettings:
    """Validated in __post_init__; read with kvtb.settings.load_settings(ComputeSettings, "compute")."""

    policy: str = "triggered"
    num_slots: int = 8
    max_context_tokens: int = 4096
    chunk_tokens: int = 32
    listen_address: str = "127.0.0.1:50071"
    metrics_address: str = "127.0.0.1:9102"  # Prometheus /metrics
    credentials_dir: str = ""   # the deployment's credentials (kvtb.credentials); "": $KVTB_CREDENTIALS_DIR or var/credentials
    insecure: bool = False      # no TLS or peer identities on its gRPC ports (benchmarks of what security costs only)
    agent_address: str = "127.0.0.1:50051"
    advertise_address: str = ""  # where the agent reaches this node (empty: the bound listen address)
    # Under `cpu`: the storage nodes' fabric addresses (tcp://host:port) the compute process
    # writes its own chunks to, and the NVMe-oF names it connects with.
    storage_fabric_addresses: tuple[str, ...] = ("tcp://127.0.0.1:55061",)
    storage_host_nqn: str = COMPUTE_NQN  # on the storage nodes' default allow list
    fabric_security: str = "auth"   # as the agent's: auth (DH-HMAC-CHAP + MACed capsules), curve, or off
    kv_mac: bool = True             # the chunk MAC, as the agent's (both read kv-mac.key)
    storage_nsid: int = 1
    key_salt: str = "kvtestbed-default-salt"  # the agent's `salt`: both write the same keys
    restore_timeout_s: float = 10.0
    drain_timeout_s: float = 10.0
    register_timeout_s: float = 60.0
    queue_bound: int = 64
    lease_s: float = 30.0
    default_max_new_tokens: int = 256
    model_cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    model_dtype: str = "float32"
    torch_threads: int = 0  # 0: all cores
    node_name: str = "compute0"
    access_key: str = ""  # empty: a random key per start
    require_agent: bool = False  # under resident/recompute, fail when the agent cannot be reached

    def __post_init__(self):
        assert self.policy in POLICIES, f"policy must be one of {POLICIES}, got {self.policy!r}"
        assert self.num_slots > 0, "num_slots must be positive"
        assert self.max_context_tokens > 0, "max_context_tokens must be positive"
        assert 0 < self.chunk_tokens <= self.max_context_tokens, "chunk_tokens must be in (0, max]"
        assert self.restore_timeout_s > 0, "restore_timeout_s must be positive"
        assert self.queue_bound > 0, "queue_bound must be positive"
        assert self.model_dtype == "float32", "only float32 KV is supported (the pool is fp32)"
        assert self.node_name and "/" not in self.node_name, "node_name must be a plain name"
        assert self.fabric_security in FABRIC_SECURITY_MODES, f"fabric_security: one of {FABRIC_SECURITY_MODES}"

    @property
    def shm_name(self) -> str:
        """The region's /dev/shm name, unique per node name and process."""
        return f"kvtb-{self.node_name}-{os.getpid()}"

    @property
    def offloads(self) -> bool:
        return self.policy in ("triggered", "cpu")
