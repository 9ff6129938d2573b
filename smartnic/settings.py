"""The agent's settings (section `smartnic`): one frozen dataclass."""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from fabric.auth import MODES as FABRIC_SECURITY_MODES
from kvtb.credentials import AGENT_NQN
from kvtb.placement import parse_cpus
from kvtb.settings import require

EVICTION_POLICIES = ("lru", "timer", "both")
FASTPATHS = ("thread", "process")  # smartnic.fastpath: where standing PUTs fire
ADMISSIONS = ("always", "on_reuse")  # smartnic.admission: which blocks a standing PUT keeps


class StorageNodeRef(NamedTuple):
    name: str
    admin_address: str
    fabric_address: str


DEFAULT_STORAGE_NODES = (
    StorageNodeRef("storage-0", "127.0.0.1:50061", "tcp://127.0.0.1:55061"),
    StorageNodeRef("storage-1", "127.0.0.1:50062", "tcp://127.0.0.1:55062"),
)


def _node(value: Any) -> StorageNodeRef:
    """From a mapping {name, admin_address, fabric_address} or "name=admin=fabric" (environment)."""
    if isinstance(value, StorageNodeRef):
        return value
    if isinstance(value, str):
        parts = value.split("=")
        if len(parts) == 2:
            parts = [parts[0], "", parts[1]]
        require(len(parts) == 3, f"storage node {value!r}: expected name=admin_address=fabric_address")
        return StorageNodeRef(*parts)
    value = dict(value)
    require("name" in value and "fabric_address" in value, f"storage node {value}: name and fabric_address")
    return StorageNodeRef(str(value["name"]), str(value.get("admin_address", "")),
                          str(value["fabric_address"]))


@dataclasses.dataclass(frozen=True)
class SmartNicSettings:
    """Immutable, validated at construction; sizes in bytes, times in seconds."""

    listen_address: str = "127.0.0.1:50051"
    metrics_address: str = "127.0.0.1:9101"  # Prometheus /metrics
    credentials_dir: str = ""   # the deployment's credentials (kvtb.credentials); "": $KVTB_CREDENTIALS_DIR or var/credentials
    insecure: bool = False      # no TLS or peer identities on its gRPC ports (benchmarks of what security costs only)
    identity: str = "smartnic"  # its certificate's identity (replica i of `kvtb up --replicas`: smartnic-i)
    cpus: str = ""              # the CPUs it runs on, a CPU list ("0-2,5"; kvtb.placement); "": all
    storage_nodes: tuple = DEFAULT_STORAGE_NODES
    host_nqn: str = AGENT_NQN   # on the storage nodes' default allow list
    # the storage fabric: "auth" authenticates each connection (DH-HMAC-CHAP with this host's key)
    # and MACs every capsule; "curve" also encrypts it (ZeroMQ CURVE); "off" is neither (benchmarks)
    fabric_security: str = "auth"
    kv_mac: bool = True         # a keyed MAC on every stored chunk, checked before restored KV is used
    namespace_id: int = 1
    salt: str = "kvtestbed-default-salt"   # per deployment; the compute node's `cpu` policy must use the same
    queue_bound: int = 512                 # deferred work queue entries (a Cassini service's limit)
    capacity_high_bytes: int = 8 << 30     # LRU eviction starts above this many bytes stored
    capacity_low_bytes: int = 6 << 30      # ... and stops at this many
    ttl_s: float = 3600.0                  # idle time-to-live of a context
    eviction_policy: str = "both"          # lru, timer or both
    eviction_interval_s: float = 0.5       # and at once when a stored block takes the total past the high mark
    admission: str = "always"              # always (the paper's), or on_reuse: store a block once seen twice
    admission_max_names: int = 1 << 20     # on_reuse: names seen once that it remembers (LRU)
    get_timeout_s: float = 3.0             # a GET not done by then completes with an error
    fabric_timeout_s: float = 5.0
    queue_depth: int = 128                 # per storage node
    reconnect_interval_s: float = 1.0
    compute_address: str = ""              # where turns go when no region named a compute node
    # the counter watcher's adaptive polling (smartnic.watcher): back to back for spin_us after a fire,
    # every poll_us for warm_ms after it, then sleeps doubling up to max_sleep_us
    watcher_spin_us: float = 50.0          # (a spinning SCHED_FIFO watcher takes its core from the forward)
    watcher_poll_us: float = 30.0
    watcher_warm_ms: float = 2000.0
    watcher_max_sleep_us: float = 400.0
    watcher_realtime: bool = True          # the watcher thread as SCHED_FIFO 1, where the OS permits it
    watcher_compiled: bool = True          # the compiled poller and the pool's doorbell, where built ...
    watcher_bell_timeout_ms: float = 5.0   # ... whose sleep ends at the doorbell or after this long
    watcher_nap_us: float = 0.0            # ... or, for watcher_nap_warm_ms after a fire, naps this long at a
    watcher_nap_warm_ms: float = 10000.0   # time, the doorbell left awake: the compute node's stores then make no
                                           # system call (0: off; placement nic turns it on, its watcher having a
                                           # CPU the compute node does not use)
    watcher_fire_ring: bool = False        # the compiled poller's own thread polls and hands checked fires to the
                                           # PUT path through a ring (smartnic/fire_ring.h), no Python between
    # where standing PUTs fire: "thread" (a thread of the agent) or "process" (smartnic.fastpath: a process
    # of its own, away from the control plane's interpreter lock); busy: its watcher polls without ever
    # sleeping, as NIC hardware does (placement `nic`: a core of its own; on shared cores it takes the forward's)
    fastpath: str = "thread"
    watcher_busy_poll: bool = False
    fastpath_cpus: str = ""                # the fast path process's CPUs ("": the agent's); the agent's
                                           # own threads leave them (placement nic: a NIC CPU of its own)
    datapath_workers: int = 1             # threads that submit Deletes (completions need none)
    view_min_bytes: int = 1 << 20          # PUT sends ranges from this size as views, joins smaller ones
    get_pdu_bytes: int = 2 << 20           # GET asks for larger values in data PDUs of this size (0: whole)
    grpc_workers: int = 32                 # threads for the SmartNic and MatchAction methods and the relay's
                                           # blocking steps (a relayed turn's stream holds none)
    max_relayed_turns: int = 1024          # turns relayed to the compute node at once; past it RESOURCE_EXHAUSTED
    # replicas (several agent and compute node pairs sharing the storage nodes)
    replica: str = "replica-0"             # this agent's replica name (TurnRecord.replica)
    compute_identity: str = "compute"      # its compute node's identity: the only caller (besides the operator)
                                           # of its memory, counter and trigger methods; the peer it dials
    # the miss path (smartnic.discovery): full blocks of a prompt missing in this agent's index are asked
    # of the storage nodes their keys place on (another replica may have stored them), one round trip per
    # node, within discovery_timeout_s; off: a single replica's lookups stay local
    discovery: bool = True
    discovery_timeout_s: float = 1.0
    # a block read (discovery's header reads, a restore's GETs) is leased on its node this long, so no
    # other replica's eviction deletes it meanwhile (at least get_timeout_s; the node caps it)
    read_lease_s: float = 30.0

    def __post_init__(self) -> None:
        parse_cpus(self.cpus)  # ValueError on a bad CPU list
        parse_cpus(self.fastpath_cpus)
        nodes = self.storage_nodes
        if isinstance(nodes, str):
            nodes = [n for n in nodes.split(",") if n.strip()]
        object.__setattr__(self, "storage_nodes", tuple(_node(n) for n in nodes))
        names = [n.name for n in self.storage_nodes]
        require(names and len(set(names)) == len(names), "storage_nodes: at least one, unique names")
        require(self.namespace_id >= 1, "namespace_id is 1-based")
        require(self.salt, "salt must not be empty")
        require(isinstance(self.identity, str) and self.identity and self.identity.replace("-", "").isalnum(),
                f"identity must be a credentials identity (letters, digits, '-'), got {self.identity!r}")
        require(self.queue_bound > 0, "queue_bound must be positive")
        require(self.grpc_workers > 0 and self.max_relayed_turns > 0,
                "grpc_workers and max_relayed_turns must be positive")
        require(self.view_min_bytes > 0, "view_min_bytes must be positive")
        require(min(self.watcher_spin_us, self.watcher_poll_us, self.watcher_warm_ms, self.watcher_max_sleep_us,
                    self.watcher_bell_timeout_ms, self.watcher_nap_us, self.watcher_nap_warm_ms) >= 0,
                "watcher_*: not negative")
        # the storage node refuses smaller PDUs (storage_node.commands.MIN_DATA_PDU_BYTES), so every
        # GET would fail: refused here, at start, instead (not imported: settings stay free of protobuf)
        require(self.get_pdu_bytes == 0 or self.get_pdu_bytes >= 4096, "get_pdu_bytes: 0 or at least 4096")
        require(0 <= self.capacity_low_bytes <= self.capacity_high_bytes, "need low <= high watermark")
        require(self.ttl_s > 0 and self.get_timeout_s > 0 and self.fabric_timeout_s > 0,
                "ttl_s, get_timeout_s and fabric_timeout_s must be positive")
        require(self.eviction_policy in EVICTION_POLICIES, f"eviction_policy: one of {EVICTION_POLICIES}")
        require(self.admission in ADMISSIONS, f"admission: one of {ADMISSIONS}")
        if self.fastpath not in FASTPATHS:
            raise ValueError(f"fastpath: one of {FASTPATHS}, got {self.fastpath!r}")
        require(self.admission_max_names > 0, "admission_max_names must be positive")
        require(self.fabric_security in FABRIC_SECURITY_MODES, f"fabric_security: one of {FABRIC_SECURITY_MODES}")
        require(self.replica and self.compute_identity, "replica and compute_identity must not be empty")
        require(0 < self.discovery_timeout_s <= 60, "discovery_timeout_s must be in (0, 60]")
        require(0 <= self.read_lease_s <= 3600, "read_lease_s must be in [0, 3600]")

    @property
    def lease_ms(self) -> int:
        """The lease a read asks for (0: none): read_lease_s, and at least a GET's deadline."""
        return int(max(self.read_lease_s, self.get_timeout_s) * 1000) if self.read_lease_s else 0
