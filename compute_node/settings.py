"""The compute node's settings: one frozen dataclass, section `compute` of the config file."""
from __future__ import annotations

import dataclasses
import os

from compute_node.offload_thread import MAX_NAP_US
from fabric.auth import MODES as FABRIC_SECURITY_MODES
from hostmem.kv_dtype import KV_DTYPES
from kvtb.credentials import COMPUTE_NQN
from kvtb.placement import parse_cpus
from kvtb.settings import require

POLICIES = ("triggered", "cpu", "resident", "recompute")
PREEMPTIONS = ("swap", "swap-host", "recompute")


def _default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "kvtestbed", "smollm2-135m-instruct")


@dataclasses.dataclass(frozen=True)
class ComputeSettings:
    """Validated in __post_init__; read with kvtb.settings.load_settings(ComputeSettings, "compute")."""

    policy: str = "triggered"
    # The paged KV pool: "KV memory available" (the recompute-vs-swap poster sweeps it), in
    # tokens; the pool holds pool_tokens // block_tokens blocks. A block is the NIC's unit.
    pool_tokens: int = 32768
    block_tokens: int = 32
    layer_groups: int = 4             # GET completion counters per block (the agent bumps all when a block lands)
    max_context_tokens: int = 8192    # one sequence's prompt + reply at most
    # Continuous batching (vLLM's names): sequences in one step, tokens in one step (decodes and
    # chunked prefills together), and how a sequence is preempted when blocks run out.
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    # While one user holds more than half the batch (compute_node.fair_order): places past max_num_seqs a
    # newcomer's first turn may take rather than wait for the greedy user's turns to end, and a step of
    # its own for a newcomer's first token (never twice in a row), so its TTFT is not a full batch step's
    newcomer_slots: int = 4
    first_token_steps: bool = True
    # While another user's sequence runs beside a prefill, a step stays within this many seconds (half of it
    # while another user's turn is about to start, and for 2 s of steps after another user was last seen):
    # each prefill chunk takes only the tokens that the step time measured so far says fit
    # (compute_node.step_budget), the next admission's prompt counted in first. Alone, prompts prefill in
    # full chunks of max_num_batched_tokens. 0: no time bound (vLLM's fixed long_prefill_token_threshold is
    # the token-count analogue).
    step_target_s: float = 0.25
    # How a sequence is preempted: swap (its KV stored by the turn's policy, restored later; under a
    # policy that stores nothing it is recomputed), swap-host (its KV blocks copied into the host swap
    # tier below and back: vLLM's CPU swap space; any policy) or recompute.
    preemption: str = "swap"
    # The host swap tier's size in tokens (whole blocks), for preemption swap-host: 0 means as large as
    # the pool. A victim that does not fit is recomputed (counted in swap_host_fallbacks).
    swap_space_tokens: int = 0
    # The prefix cache: an admitted sequence finds full blocks already computed (a preempted one, its own freed
    # blocks). False: nothing is ever found, so a recompute preemption recomputes everything it lost (vLLM
    # before automatic prefix caching, as in the recompute-vs-swap poster; `kvtb study poster` runs so).
    prefix_cache: bool = True
    device: str = "cpu"
    # Decode attention (and chunks of a few tokens) read straight from the pool by the compiled kernel
    # (compute_node._attention) when the install built it; false: gather, then torch's attention.
    attention_kernel: bool = True
    listen_address: str = "127.0.0.1:50071"
    metrics_address: str = "127.0.0.1:9102"  # Prometheus /metrics
    credentials_dir: str = ""   # the deployment's credentials (kvtb.credentials); "": $KVTB_CREDENTIALS_DIR or var/credentials
    insecure: bool = False      # no TLS or peer identities on its gRPC ports (benchmarks of what security costs only)
    # Its own certificate's identity, and its agent's: the only peer besides the operator that may call it,
    # and the one it expects when it dials the agent (replica i of `kvtb up --replicas`: compute-i, smartnic-i).
    identity: str = "compute"
    agent_identity: str = "smartnic"
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
    restore_timeout_s: float = 10.0   # longer than the agent's GET deadline: by then every GET ended
    # A forward waits at most this long before a layer group of a restore still landing; past it that
    # sequence's output of the step is dropped and it waits outside the batch for the rest (the others
    # go on).
    restore_layer_wait_s: float = 1.0
    drain_timeout_s: float = 10.0     # a PUT not done by then: the turn stops waiting; the block stays out of use until the PUT ends
    register_timeout_s: float = 60.0
    queue_bound: int = 256            # turns waiting for the batch; past it RESOURCE_EXHAUSTED
    default_max_new_tokens: int = 256
    model_cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    model_dtype: str = "float32"
    # The KV pool's element type (hostmem.kv_dtype; vLLM's kv_cache_dtype): float32, bfloat16 (half the
    # bytes stored, moved and restored) or float8_e4m3fn (a quarter; clamped to +-448). Attention reads it
    # at the model's precision; every stored chunk records it and a restore into a pool of another is refused.
    kv_dtype: str = "float32"
    # The CPUs it runs on (a CPU list, "0-2,5"; kvtb.placement; "": all) and torch's threads: 0 is one per
    # CPU of that set; with a set given, each OpenMP thread is bound to one of its CPUs (torch_bind).
    cpus: str = ""
    torch_threads: int = 0
    # Triggered stores (each filled block's descriptor and trigger) on a thread of their own, as the NIC's
    # work (compute_node.offload_thread), on these CPUs ("": the node's; placement nic: the NIC's), not on
    # the engine's; false: on the engine's thread, between two steps.
    offload_thread: bool = True
    offload_thread_cpus: str = ""
    # 0: a hand-off wakes the thread (a futex wake, on the engine's thread); else the thread looks for work
    # every this many µs and a hand-off is an append (placement nic: on the NIC's CPUs, where naps cost
    # the NIC's CPU, not the forward's)
    offload_thread_nap_us: int = 0
    torch_bind: bool = True
    node_name: str = "compute0"
    access_key: str = ""  # empty: a random key per start
    require_agent: bool = False  # under resident/recompute, fail when the agent cannot be reached

    def __post_init__(self):
        parse_cpus(self.cpus)  # ValueError on a bad CPU list
        parse_cpus(self.offload_thread_cpus)
        if not 0 <= self.offload_thread_nap_us <= MAX_NAP_US:
            raise ValueError(f"offload_thread_nap_us must be 0 .. {MAX_NAP_US}, got {self.offload_thread_nap_us}")
        if self.torch_threads < 0:
            raise ValueError(f"torch_threads must not be negative, got {self.torch_threads}")
        require(self.policy in POLICIES, f"policy must be one of {POLICIES}, got {self.policy!r}")
        require(self.block_tokens > 0, "block_tokens must be positive")
        require(self.pool_tokens >= self.block_tokens, "pool_tokens must hold at least one block")
        require(self.max_context_tokens > 0, "max_context_tokens must be positive")
        require(self.layer_groups > 0, "layer_groups must be positive")
        require(0 < self.max_num_seqs and 0 <= self.newcomer_slots
                and self.max_num_seqs + self.newcomer_slots <= self.max_num_batched_tokens,
                "need 0 < max_num_seqs, 0 <= newcomer_slots and max_num_seqs + newcomer_slots <= "
                "max_num_batched_tokens (a decode per sequence fits a step)")
        require(isinstance(self.step_target_s, (int, float)) and not isinstance(self.step_target_s, bool)
                and self.step_target_s >= 0,
                f"step_target_s must be >= 0 seconds (0: no time bound), got {self.step_target_s!r}")
        if self.preemption not in PREEMPTIONS:
            raise ValueError(f"preemption must be one of {PREEMPTIONS}, got {self.preemption!r}")
        if isinstance(self.swap_space_tokens, bool) or not isinstance(self.swap_space_tokens, int) \
                or self.swap_space_tokens < 0:
            raise ValueError(f"swap_space_tokens must be a whole number >= 0 (0: the pool's size), "
                             f"got {self.swap_space_tokens!r}")
        if 0 < self.swap_space_tokens < self.block_tokens:
            raise ValueError(f"swap_space_tokens {self.swap_space_tokens} holds no block of "
                             f"{self.block_tokens} tokens (0: the pool's size)")
        require(self.restore_timeout_s > 0, "restore_timeout_s must be positive")
        require(self.restore_layer_wait_s > 0, "restore_layer_wait_s must be positive")
        require(self.queue_bound > 0, "queue_bound must be positive")
        require(self.model_dtype == "float32", "the model computes in float32 only (kv_dtype sets the KV's type)")
        require(self.kv_dtype in KV_DTYPES, f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        require(self.node_name and "/" not in self.node_name, "node_name must be a plain name")
        for field in ("identity", "agent_identity"):
            name = getattr(self, field)
            require(isinstance(name, str) and name and name.replace("-", "").isalnum(),
                    f"{field} must be a credentials identity (letters, digits, '-'), got {name!r}")
        require(self.fabric_security in FABRIC_SECURITY_MODES, f"fabric_security: one of {FABRIC_SECURITY_MODES}")

    @property
    def shm_prefix(self) -> str:
        """What the names of this node's regions start with: then the pid of the process that made each."""
        return f"kvtb-{self.node_name}-"

    @property
    def shm_name(self) -> str:
        """The region's /dev/shm name, unique per node name and process."""
        return f"{self.shm_prefix}{os.getpid()}"

    @property
    def swap_space_blocks(self) -> int:
        """Blocks the host swap tier holds (swap_space_tokens, or the pool's size when 0)."""
        return (self.swap_space_tokens or self.pool_tokens) // self.block_tokens

    @property
    def num_blocks(self) -> int:
        return self.pool_tokens // self.block_tokens
