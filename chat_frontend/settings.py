"""The chat frontend's settings: section `frontend` of the config file."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from chat_frontend.admission import UserLimits
from chat_frontend.routing import POLICIES
from kvtb.placement import parse_cpus
from kvtb.settings import load_settings, require

DEFAULT_TENANT = "default"
# A user's share of the frontend (FrontendSettings.limits_of); `tenant_limits` overrides them per tenant.
USER_LIMITS = ("user_max_concurrent_turns", "user_max_waiting_turns", "user_max_queued_prompt_tokens")
MAX_REPLICAS = 64
FIRST_REPLICA = "replica-0"       # the replica at agent_address when `replicas` is empty
FIRST_AGENT_IDENTITY = "smartnic"  # replica 0's agent (kvtb.credentials.replica_identities(0))


@dataclasses.dataclass(frozen=True)
class ReplicaAddress:
    """One replica (a SmartNIC agent and its compute node) as the frontend dials it."""

    name: str
    address: str      # the agent's gRPC address
    identity: str     # the agent's certificate identity


def parse_replica(entry: str) -> ReplicaAddress:
    """"NAME=ADDRESS=IDENTITY" ("replica-1=127.0.0.1:50053=smartnic-1"), or SettingsError naming it."""
    parts = entry.split("=") if isinstance(entry, str) else []
    require(len(parts) == 3 and all(p.strip() for p in parts),
            f"replicas: {entry!r} is not NAME=ADDRESS=IDENTITY (e.g. replica-1=127.0.0.1:50053=smartnic-1)")
    name, address, identity = (p.strip() for p in parts)
    host, _, port = address.rpartition(":")
    require(host and port.isdigit() and 0 < int(port) < 65536,
            f"replicas: {entry!r}: the address {address!r} is not HOST:PORT")
    require(all(c.isalnum() or c in "-_." for c in name) and len(name) <= 64,
            f"replicas: {entry!r}: the name {name!r} must be at most 64 letters, digits, '-', '_' or '.'")
    return ReplicaAddress(name, address, identity)


def _check_user_limits(where: str, fields: Mapping[str, object]) -> None:
    for name in USER_LIMITS:
        value = fields[name]
        require(isinstance(value, int) and not isinstance(value, bool),
                f"{where}{name} must be a whole number, got {value!r}")
        require(value >= 0, f"{where}{name} must not be negative (0: no quota)")


@dataclasses.dataclass(frozen=True)
class FrontendSettings:
    """Where the frontend listens, whom it forwards to, who may use it and its limits.

    Every address defaults to loopback: `/metrics` (`metrics_address`), the OpenAI API and gRPC
    are reachable from this host only until the operator binds them elsewhere. The metrics carry
    no user names: a turn counts for its user's tenant, from `tenants` (a YAML mapping user name ->
    tenant name; a user not listed belongs to tenant "default"). A user's KV serves that user only;
    `shared_system_prompts` marks, per tenant, a system prompt whose KV all the tenant's users share.
    """

    listen_address: str = "127.0.0.1:50050"
    http_address: str = "127.0.0.1:8000"     # the OpenAI-compatible API
    metrics_address: str = "127.0.0.1:9100"  # Prometheus /metrics
    credentials_dir: str = ""   # the deployment's credentials (kvtb.credentials); "": $KVTB_CREDENTIALS_DIR or var/credentials
    insecure: bool = False      # no TLS or peer identities on its gRPC ports (benchmarks of what security costs only)
    cpus: str = ""              # the CPUs it runs on, a CPU list ("0-2,5"; kvtb.placement); "": all
    agent_address: str = "127.0.0.1:50051"   # the SmartNIC agent in front of the compute node (unused with `replicas`)
    storage_admin_addresses: tuple[str, ...] = ("127.0.0.1:50061", "127.0.0.1:50062")
    data_dir: str = "var/frontend"
    users: Mapping[str, str] = dataclasses.field(default_factory=dict)  # user name -> token
    tenants: Mapping[str, str] = dataclasses.field(default_factory=dict)  # user name -> tenant
    system_prompt: str = ""                  # when the client sends none; empty: the chat template's default
    # tenant -> a system prompt whose KV the tenant's users share (otherwise a prefix serves its user only)
    shared_system_prompts: Mapping[str, str] = dataclasses.field(default_factory=dict)
    session_headers: tuple[str, ...] = ()    # headers naming the session after X-Session-Id (X-Correlation-ID)
    session_from_user_field: bool = False    # OpenAI's `user` field names the session when no header does
    max_n: int = 8                           # choices one request may ask for (OpenAI's n)
    # Tokens to generate (OpenAI's max_tokens), as vLLM: at most what the model's context leaves after
    # the prompt; absent, all of that. Optional lower limits, 0: none. default: a request that gives no
    # max_tokens (vLLM's generation-config max_tokens); cap: every request, a larger max_tokens lowered
    # to it, not refused (vLLM's override_max_tokens). chat_frontend.limits.max_new_tokens.
    max_new_tokens_default: int = 0
    # the gRPC Chat API's reply length when a request gives none (kvtb chat): a CPU generating all that
    # the context leaves takes minutes when the model does not end its turn; at most what the context leaves
    chat_max_new_tokens: int = 256
    max_new_tokens_cap: int = 0
    # turns forwarded to the agents at once: past a compute node's batch (max_num_seqs) they wait in its
    # scheduler, which is fair across users; at most its queue_bound (256) wait there
    max_concurrent_turns: int = 256
    max_waiting_turns: int = 256             # turns waiting for one of those; a full room pushes out (admission)
    queue_timeout_s: float = 60.0            # how long a turn may wait for its turn
    # An operator's quotas per user (chat_frontend.admission), 0: none, the default (a user alone may
    # use every place; the fair share only bites when users contend): turns running at once (past it
    # they wait), turns waiting, and prompt tokens of its turns running or waiting (estimated from the
    # text's bytes; one turn alone always passes). Past them RESOURCE_EXHAUSTED (HTTP 429).
    user_max_concurrent_turns: int = 0
    user_max_waiting_turns: int = 0
    user_max_queued_prompt_tokens: int = 0
    # tenant -> overrides of the user_* limits for that tenant's users ({"team-b": {"user_max_concurrent_turns": 16}})
    tenant_limits: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    operators: tuple[str, ...] = ()          # users (of `users`) whose token shows SystemStats in detail
    # users (of `users`) whose token may also read the API port's /metrics (a Prometheus outside the
    # deployment): every tenant's traffic and the system's load, nothing else beyond what a user may
    metrics_readers: tuple[str, ...] = ()
    agent_timeout_s: float = 300.0           # deadline of one forwarded turn
    info_retry_s: float = 0.5                # how often to ask the agent's Info until it answers
    # Several replicas (agent and compute node pairs), each "NAME=ADDRESS=IDENTITY"
    # ("replica-1=127.0.0.1:50053=smartnic-1"; env: a comma-separated list). Empty: one replica,
    # "replica-0" at agent_address with identity "smartnic".
    replicas: tuple[str, ...] = ()
    routing: str = "kv_aware"                # round_robin | least_loaded | kv_aware (chat_frontend.routing)
    # kv_aware: the replica holding the longest prefix unless its load exceeds the least loaded's by
    # more than this many sequences (SGLang's balance_abs_threshold); then the least loaded
    balance_abs_threshold: int = 4
    health_interval_s: float = 1.0           # how often each replica is probed
    health_timeout_s: float = 2.0            # a probe not answered within it takes the replica out

    def __post_init__(self):
        parse_cpus(self.cpus)  # ValueError on a bad CPU list
        require(self.listen_address, "listen_address must be set")
        require(self.agent_address, "agent_address must be set")
        require(isinstance(self.max_n, int) and 1 <= self.max_n <= 64, "max_n must be in [1, 64]")
        for name in ("max_new_tokens_default", "max_new_tokens_cap", "chat_max_new_tokens"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                    f"{name} must be a whole number >= 0 (0: what the context leaves), got {value!r}")
        require(not (self.max_new_tokens_default and self.max_new_tokens_cap)
                or self.max_new_tokens_default <= self.max_new_tokens_cap,
                "need max_new_tokens_default <= max_new_tokens_cap when both are set")
        require(self.max_concurrent_turns > 0, "max_concurrent_turns must be positive")
        require(self.max_waiting_turns >= 0, "max_waiting_turns must not be negative")
        require(self.queue_timeout_s > 0, "queue_timeout_s must be positive")
        tokens = list(self.users.values())
        require(all(isinstance(t, str) and t for t in tokens), "every user needs a non-empty token")
        require(len(set(tokens)) == len(tokens), "two users share a token")
        require(all(isinstance(t, str) and t for t in self.tenants.values()),
                "every tenant needs a non-empty name")
        unknown = sorted(set(self.tenants) - set(self.users))
        require(not unknown, f"tenants names users that are not in users: {unknown}")
        known = {*self.tenants.values(), DEFAULT_TENANT}
        unknown = sorted(set(self.shared_system_prompts) - known)
        require(not unknown, f"shared_system_prompts names tenants no user belongs to: {unknown}")
        require(all(isinstance(p, str) for p in self.shared_system_prompts.values()),
                "every shared system prompt must be text")
        require(all(isinstance(h, str) and h.strip() for h in self.session_headers),
                "session_headers must be header names")
        unknown = sorted(set(self.operators) - set(self.users))
        require(not unknown, f"operators names users that are not in users: {unknown}")
        unknown = sorted(set(self.metrics_readers) - set(self.users))
        require(not unknown, f"metrics_readers names users that are not in users: {unknown}")
        _check_user_limits("", self.user_limits_fields())
        require(self.routing in POLICIES, f"routing must be one of {', '.join(POLICIES)}, got {self.routing!r}")
        require(isinstance(self.balance_abs_threshold, int) and self.balance_abs_threshold >= 0,
                "balance_abs_threshold must be a whole number >= 0")
        require(0 < self.health_interval_s <= 3600, "health_interval_s must be in (0, 3600]")
        require(0 < self.health_timeout_s <= 600, "health_timeout_s must be in (0, 600]")
        require(len(self.replicas) <= MAX_REPLICAS, f"replicas: at most {MAX_REPLICAS}, got {len(self.replicas)}")
        names = [r.name for r in self.replica_addresses()]  # SettingsError naming a bad entry
        twice = sorted({n for n in names if names.count(n) > 1})
        require(not twice, f"replicas: names must be unique; repeated: {twice}")
        unknown = sorted(set(self.tenant_limits) - known)
        require(not unknown, f"tenant_limits names tenants no user belongs to: {unknown}")
        for tenant, overrides in self.tenant_limits.items():
            require(isinstance(overrides, Mapping), f"tenant_limits.{tenant} must be a mapping of "
                    f"{', '.join(USER_LIMITS)}")
            wrong = sorted(set(overrides) - set(USER_LIMITS))
            require(not wrong, f"tenant_limits.{tenant}: unknown limits {wrong}; "
                    f"known: {', '.join(USER_LIMITS)}")
            _check_user_limits(f"tenant_limits.{tenant}.", {**self.user_limits_fields(), **overrides})

    def replica_addresses(self) -> list[ReplicaAddress]:
        """The replicas to route over: `replicas`, or the one at agent_address."""
        if not self.replicas:
            return [ReplicaAddress(FIRST_REPLICA, self.agent_address, FIRST_AGENT_IDENTITY)]
        return [parse_replica(entry) for entry in self.replicas]

    def user_limits_fields(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in USER_LIMITS}

    def limits_of(self, user: str) -> UserLimits:
        """The user's quotas: the user_* settings, overridden by the user's tenant's `tenant_limits`
        (0: none)."""
        fields = {**self.user_limits_fields(), **self.tenant_limits.get(self.tenant_of(user), {})}
        return UserLimits(max_concurrent_turns=int(fields["user_max_concurrent_turns"]) or None,
                          max_waiting_turns=int(fields["user_max_waiting_turns"]) or None,
                          max_queued_prompt_tokens=int(fields["user_max_queued_prompt_tokens"]) or None)

    def tenant_of(self, user: str) -> str:
        """The user's tenant: its metrics and (with the user, or alone for a shared prompt) its KV's salt."""
        return self.tenants.get(user, DEFAULT_TENANT)

    @property
    def db_path(self) -> str:
        return os.path.join(self.data_dir, "frontend.sqlite3")


def load(config_path: str | None = None, **overrides) -> FrontendSettings:
    """Read the `frontend` section (and KVTB_FRONTEND_* overrides)."""
    return load_settings(FrontendSettings, "frontend", config_path, overrides=overrides)
