"""Which replica (a SmartNIC agent and its compute node) serves a turn: the routing policies. Pure.

`round_robin`: the next healthy replica in turn. `least_loaded`: the healthy replica with the
fewest sequences: running, waiting and restoring in its own last Stats figures, plus the turns the
frontend sent it since those figures. `kv_aware` (as SGLang's cache-aware router and Dynamo's KV
router): an approximate index of what was routed where (`PrefixIndex`: chains of block hashes of
the prompts' token ids, in blocks of the compute nodes' pool (their Info's block_tokens), bounded, least recently used first out) names the
replica whose pool most likely still holds the longest prefix of the turn's prompt; it gets the
turn unless its load exceeds the least loaded's by more than `balance_abs_threshold` sequences
(SGLang's setting of that name); otherwise, or when no replica holds a prefix, the least loaded
gets it and its KV comes from the storage nodes. Hash chains start from the owner (tenant and
user), so one user's prefix never matches another's, even for routing. Ties go in turn.
"""
from __future__ import annotations

import array
import collections
import dataclasses
import hashlib
from collections.abc import Iterable, Sequence

POLICIES = ("round_robin", "least_loaded", "kv_aware")
MAX_CHAIN_BLOCKS = 8192           # blocks of a prompt the index looks at (262144 tokens)
PREFIX_INDEX_BLOCKS = 1 << 18     # blocks (hash, replicas) the index keeps, over all replicas


def block_hashes(owner: str, token_ids: Sequence[int], block_tokens: int) -> list[bytes]:
    """The chained hashes of the full blocks of token_ids: block i's hash covers blocks 0..i and the owner."""
    h = hashlib.blake2b(owner.encode(), digest_size=16, person=b"kvtb-route").digest()
    full = min(len(token_ids) // block_tokens, MAX_CHAIN_BLOCKS)
    data = memoryview(array.array("I", token_ids[:full * block_tokens]).tobytes())  # uint32, as the proto's
    size = block_tokens * 4
    out = []
    for i in range(full):
        h = hashlib.blake2b(h, digest_size=16)
        h.update(data[i * size:(i + 1) * size])
        h = h.digest()
        out.append(h)
    return out


class PrefixIndex:
    """Block hash -> replicas a prompt with that prefix was routed to; at most `capacity` hashes."""

    def __init__(self, capacity: int = PREFIX_INDEX_BLOCKS):
        if capacity <= 0:
            raise ValueError("a prefix index needs a positive capacity")
        self.capacity = capacity
        self._blocks: collections.OrderedDict[bytes, set[str]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def insert(self, hashes: Iterable[bytes], replica: str) -> None:
        for h in hashes:
            holders = self._blocks.get(h)
            if holders is None:
                holders = self._blocks[h] = set()
            else:
                self._blocks.move_to_end(h)
            holders.add(replica)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def match(self, hashes: Sequence[bytes]) -> dict[str, int]:
        """Replica -> how many leading blocks of the chain were routed to it (only replicas with > 0)."""
        matched: dict[str, int] = {}
        alive: set[str] | None = None
        for i, h in enumerate(hashes):
            holders = self._blocks.get(h)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders
            if not alive:
                break
            for name in alive:
                matched[name] = i + 1
        return matched

    def forget(self, replica: str) -> None:
        """Drop what was routed to the replica (it went down: its pool is gone)."""
        for h in [h for h, holders in self._blocks.items() if replica in holders]:
            holders = self._blocks[h]
            holders.discard(replica)
            if not holders:
                del self._blocks[h]


@dataclasses.dataclass(frozen=True)
class Load:
    """A healthy replica's load: its own last figures and what the frontend sent it since."""

    name: str
    running: int = 0    # ComputeStatsResponse.num_requests_running
    waiting: int = 0    # num_requests_waiting + num_requests_restoring
    sent: int = 0       # turns sent since those figures

    @property
    def sequences(self) -> int:
        return self.running + self.waiting + self.sent


@dataclasses.dataclass
class Route:
    """Where a turn went, filled in as it is served: the replica, and the one a first attempt failed on.

    follow: the route of another sequence of the same prompt (the first of a request's n choices):
    this one goes to that one's replica while it is in the rotation, whatever the policy, so that
    the prompt is prefilled once (the others find its blocks in that pool's prefix cache).
    """

    replica: str = ""
    retried_from: str = ""
    follow: Route | None = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """The chosen replica, the prefix blocks the index says it holds, and why it was chosen."""

    replica: str
    matched_blocks: int = 0
    reason: str = ""     # "in turn", "least loaded", "prefix", "balance"


class Router:
    """One policy over the replicas `names` (in their configured order). One event loop."""

    def __init__(self, names: Sequence[str], policy: str = "kv_aware", balance_abs_threshold: int = 4,
                 index: PrefixIndex | None = None, block_tokens: int = 0):
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; one of {', '.join(POLICIES)}")
        if not names:
            raise ValueError("a router needs at least one replica")
        self.names = list(names)
        self.policy = policy
        self.balance_abs_threshold = balance_abs_threshold
        self.index = index or PrefixIndex()
        self.block_tokens = block_tokens  # the pool's, once a compute node told it (0: kv_aware routes by load)
        self._last = len(self.names) - 1  # the replica chosen last (in turn: the next one after it)

    def pick(self, owner: str, token_ids: Sequence[int], healthy: Sequence[Load]) -> Decision | None:
        """The replica for a prompt of owner among the healthy ones (None if there is none)."""
        if not healthy:
            return None
        if self.policy == "round_robin":
            return self._chose(Decision(self._in_turn(healthy).name, reason="in turn"))
        least = self._least_loaded(healthy)
        if self.policy == "least_loaded":
            return self._chose(Decision(least.name, reason="least loaded"))
        if not self.block_tokens:  # no compute node said its block size yet: no prefix to match
            return self._chose(Decision(least.name, reason="least loaded"))
        matched = self.index.match(block_hashes(owner, token_ids, self.block_tokens))
        best_blocks = max((matched.get(load.name, 0) for load in healthy), default=0)
        if best_blocks == 0:
            return self._chose(Decision(least.name, reason="least loaded"))
        best = self._least_loaded([load for load in healthy if matched.get(load.name, 0) == best_blocks])
        if best.sequences - least.sequences > self.balance_abs_threshold:
            return self._chose(Decision(least.name, matched.get(least.name, 0), "balance"))
        return self._chose(Decision(best.name, best_blocks, "prefix"))

    def routed(self, owner: str, token_ids: Sequence[int], replica: str) -> None:
        """Note that the replica got (or computed) this prompt's KV (kv_aware's index)."""
        if self.policy == "kv_aware" and self.block_tokens:
            self.index.insert(block_hashes(owner, token_ids, self.block_tokens), replica)

    def forget(self, replica: str) -> None:
        """The replica went down: its pool holds nothing any more."""
        self.index.forget(replica)

    def _chose(self, decision: Decision) -> Decision:
        self._last = self.names.index(decision.replica)
        return decision

    def _in_turn(self, candidates: Sequence[Load]) -> Load:
        """The first candidate after the last chosen replica, in the configured order."""
        n = len(self.names)
        return min(candidates, key=lambda load: (self.names.index(load.name) - self._last - 1) % n)

    def _least_loaded(self, candidates: Sequence[Load]) -> Load:
        fewest = min(load.sequences for load in candidates)
        return self._in_turn([load for load in candidates if load.sequences == fewest])
