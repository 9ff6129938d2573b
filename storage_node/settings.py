"""The storage node's settings (section `storage`): one frozen dataclass."""
from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from typing import Any

from fabric.auth import MODES as FABRIC_SECURITY_MODES
from fabric.frames import FRAME_BYTES, MAX_HEADER_BYTES
from kvtb.credentials import AGENT_NQN, COMPUTE_NQN
from kvtb.placement import parse_cpus
from kvtb.settings import require

WILDCARD = "*"
COMMAND_SETS = ("key_value", "nvm")


def _normalise_hosts(hosts: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """host NQN (or "*") -> "*" (every namespace) or a tuple of namespace ids.

    From the environment it is JSON: KVTB_STORAGE_ALLOWED_HOSTS='{"nqn...:agent-0": [1]}'.
    """
    if isinstance(hosts, str):
        hosts = json.loads(hosts)
        require(isinstance(hosts, dict), "allowed_hosts: a JSON object of host NQN -> namespace ids")
    out: dict[str, Any] = {}
    for nqn, nsids in dict(hosts).items():
        if nsids == WILDCARD or nsids == [WILDCARD] or nsids == (WILDCARD,):
            out[str(nqn)] = WILDCARD
        else:
            if isinstance(nsids, (int, str)):
                nsids = [nsids]
            out[str(nqn)] = tuple(int(n) for n in nsids)
    return types.MappingProxyType(out)


@dataclasses.dataclass(frozen=True)
class StorageSettings:
    """Settings of one storage node; sizes in bytes. Immutable and validated at construction."""

    node_name: str = "storage-0"
    data_dir: str = "var/storage-0"
    subsystem_nqn: str = "nqn.2026-11.org.kvtestbed:storage-0"
    namespace_size_bytes: int = 64 << 30     # sparse files: only written blocks use disk
    namespaces: tuple[str, ...] = ("key_value", "nvm")  # command set of nsid 1, 2, ... at first start
    queue_depth: int = 128
    max_value_bytes: int = 1 << 30
    admin_address: str = "127.0.0.1:50061"
    metrics_address: str = "127.0.0.1:9103"   # Prometheus /metrics
    credentials_dir: str = ""   # the deployment's credentials (kvtb.credentials); "": $KVTB_CREDENTIALS_DIR or var/credentials
    insecure: bool = False      # no TLS or peer identities on its gRPC ports (benchmarks of what security costs only)
    cpus: str = ""              # the CPUs it runs on, a CPU list ("0-2,5"; kvtb.placement); "": all
    fabric_address: str = "tcp://127.0.0.1:55061"
    # "auth": a host authenticates at Connect (DH-HMAC-CHAP with its key, derived from the fabric's
    # master) and every capsule is MACed; "curve": the same over an encrypted ZeroMQ CURVE socket;
    # "off": neither (benchmarks of what security costs only)
    fabric_security: str = "auth"
    # host NQN (or "*") -> namespace ids it may reach (or "*"): the NIC-2 access list. By default this
    # deployment's hosts as their settings name them (the agent, the compute node's `cpu` policy);
    # "*" admits any host NQN, only when an operator writes it.
    allowed_hosts: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: {AGENT_NQN: WILDCARD, COMPUTE_NQN: WILDCARD})
    io_threads: int = 4
    fsync: bool = True                         # off only for benchmarks: acks are then not durable
    compact_min_records: int = 10_000
    # values of 1 MiB or more are sent from the data file's mapping (no copy); off: read with preadv
    mapped_reads: bool = True

    # -- work before authentication (fabric_security auth or curve) -------------------------------
    # the largest ZeroMQ frame taken (ZMQ_MAXMSGSIZE): libzmq drops a peer that announces a larger
    # one before buffering it. Hosts cut payloads into frames of 4 MiB (fabric.frames), so 16 MiB
    # leaves room; at least 4 MiB.
    max_frame_bytes: int = 16 << 20
    # handshakes begun and not finished (half-open sessions): in all, and per peer address. Past the
    # per-peer cap a peer's oldest goes; past the total, the oldest of the peer holding the most.
    max_half_open: int = 256
    max_half_open_per_peer: int = 16
    # handshakes a peer address may begin a second (burst: two seconds' worth). Every message of a
    # session not authenticated yet counts, a handshake being 6 of them; past it they are dropped
    # unanswered, so a flood costs neither state nor queued replies.
    handshakes_per_s_per_peer: float = 50.0
    handshake_timeout_s: float = 10.0   # a half-open session older than this is forgotten

    # -- every request bounded (over a cap: refused with "invalid field") ------------------------
    # ranges of one range read, counted once adjacent or overlapping ranges of one key are merged
    # (the list as sent may hold up to 4 times as many, within the 256 KiB capsule)
    max_ranges: int = 1024
    max_list_keys: int = 10_000          # keys one List may ask for (max_keys; 0 asks for 1,000)
    max_response_bytes: int = 1 << 30    # bytes one Retrieve or range read answers; >= max_value_bytes
    # bytes one command may read or checksum on the node (a range read with the guard check reads
    # each value it touches whole, once)
    max_read_bytes: int = 4 << 30
    # the longest read lease (CommandCapsule.lease_ms) a host gets: a Delete of the key by another host
    # is refused until then (storage_node.leases); held in memory, one entry per leased key it holds
    max_lease_ms: int = 60_000

    def __post_init__(self) -> None:
        parse_cpus(self.cpus)  # ValueError on a bad CPU list
        object.__setattr__(self, "allowed_hosts", _normalise_hosts(self.allowed_hosts))
        object.__setattr__(self, "namespaces", tuple(self.namespaces))
        require(self.namespace_size_bytes >= 1 << 20, "namespace_size_bytes must be at least 1 MiB")
        require(1 <= self.queue_depth <= 65535, "queue_depth must be in 1..65535")
        require(self.max_value_bytes >= 64 << 20, "max_value_bytes must be at least 64 MiB")
        require(self.io_threads >= 1, "io_threads must be at least 1")
        require(all(cs in COMMAND_SETS for cs in self.namespaces), f"namespaces: one of {COMMAND_SETS}")
        require(self.fabric_address.startswith(("tcp://", "ipc://", "inproc://")),
                "fabric_address: a ZeroMQ endpoint")
        require(self.fabric_security in FABRIC_SECURITY_MODES, f"fabric_security: one of {FABRIC_SECURITY_MODES}")
        require(self.max_frame_bytes >= max(FRAME_BYTES, MAX_HEADER_BYTES),
                f"max_frame_bytes must be at least {FRAME_BYTES} (the frames hosts send)")
        require(1 <= self.max_half_open_per_peer <= self.max_half_open,
                "max_half_open_per_peer must be in 1..max_half_open")
        require(self.handshakes_per_s_per_peer > 0, "handshakes_per_s_per_peer must be positive")
        require(self.handshake_timeout_s > 0, "handshake_timeout_s must be positive")
        require(1 <= self.max_ranges <= 4096, "max_ranges must be in 1..4096")
        require(self.max_list_keys >= 1000, "max_list_keys must be at least 1,000 (a List's default)")
        require(self.max_response_bytes >= self.max_value_bytes,
                "max_response_bytes must be at least max_value_bytes (a whole value must be readable)")
        require(self.max_read_bytes >= self.max_response_bytes,
                "max_read_bytes must be at least max_response_bytes")
        require(0 <= self.max_lease_ms <= 3_600_000, "max_lease_ms must be in 0..3600000 (an hour)")

    def allowed_namespaces(self, host_nqn: str) -> Any:
        """The namespace ids host_nqn may reach ("*" for all), or None when it is refused."""
        if host_nqn in self.allowed_hosts:
            return self.allowed_hosts[host_nqn]
        return self.allowed_hosts.get(WILDCARD)
