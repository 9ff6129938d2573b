"""Replaying block requests through the agent's own eviction and admission, and Belady's bound (pure).

The agent's classes, driven in simulated time: smartnic.requester.Requester (the index of stored
blocks), smartnic.eviction.make_policy (LRU by capacity with its high and low watermarks, the idle
timer, or both) and smartnic.admission.Admission (`always` or `on_reuse`), called as
smartnic.agent calls them. Per request, in order:

1. the timer's pass, at the first arrival in each `pass_s` seconds of trace time (the agent's loop
   runs every eviction_interval_s of its own clock; IdleTimer.victims walks every stored block, so
   a pass per arrival would cost the replay minutes: a block may outlive its TTL by up to pass_s);
2. step 5, the lookup: the longest prefix of the request's full blocks (at most input_length - 1
   tokens, as hostmem.block_hash.stored_prefix) that the index holds; those blocks are hits and are
   touched in the index and the policy;
3. every block the turn computes, from the first miss on (the prompt's, then those the reply
   fills, then its partial last block), goes through admission and, if admitted, is published and
   touched (a PUT); past the high watermark the policy names victims at once, as the agent's
   eviction thread is woken to.

Capacity is counted in blocks (every stored block is one pool block's extent: a partial block
moves its whole extent too, hostmem.kv_layout.chunk_runs). The blocks a reply fills get fresh ids:
in a Mooncake-format trace a follow-up repeats only its previous request's input blocks.

Belady's bound: MIN with bypass, offline, per block: a block is kept only if its next lookup comes
before that of the block it would displace. Its hits count every looked-up block present (not only
a prefix): an upper bound on the prefix hits of any policy at that capacity.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from collections.abc import Hashable, Sequence

from bench.mooncake import TraceRequest
from smartnic.admission import Admission
from smartnic.eviction import make_policy
from smartnic.requester import Requester, StoredBlock

INFINITE = 1 << 62
POLICIES = ("lru", "timer", "both", "on_reuse")  # on_reuse: LRU by capacity, admission on_reuse
PASS_S = 5.0  # the timer's pass, in seconds of trace time (see the module doc)
MIN_TTL_S = 1e-3


@dataclasses.dataclass(frozen=True)
class Access:
    """One request as the cache sees it: when, the blocks its turn computes (in order), how many
    leading ones it looks up, and its context."""

    time_s: float
    blocks: tuple[Hashable, ...]
    lookup: int
    context: str = ""

    @property
    def looked_up(self) -> tuple[Hashable, ...]:
        return self.blocks[:self.lookup]


def accesses_of(requests: Sequence[TraceRequest], block_tokens: int,
                contexts: Sequence[str] | None = None) -> list[Access]:
    """The accesses of requests whose lengths are in tokens of block_tokens-token blocks: the full
    input blocks by their ids, then fresh ids (negative) for the blocks of input + reply - 1 tokens
    (the last sampled token is never computed) past them."""
    out, fresh = [], 0
    for i, r in enumerate(requests):
        full_in = min(r.input_length // block_tokens, len(r.hash_ids))
        lookup = min((r.input_length - 1) // block_tokens, len(r.hash_ids))
        computed = r.input_length + max(r.output_length, 1) - 1
        total = -(-computed // block_tokens)
        ids = list(r.hash_ids[:full_in])
        for _ in range(total - full_in):
            fresh -= 1
            ids.append(fresh)
        out.append(Access(r.timestamp_ms / 1000.0, tuple(ids), lookup, contexts[i] if contexts else f"r{i}"))
    return out


@dataclasses.dataclass
class ReplayResult:
    """Hits (looked-up blocks served by the cache) against lookups, and what it cost."""

    policy: str
    capacity_blocks: int
    hits: int = 0
    lookups: int = 0
    puts: int = 0                 # blocks stored (PUTs)
    puts_skipped: int = 0         # blocks admission kept out
    evictions: dict[str, int] = dataclasses.field(default_factory=dict)
    peak_blocks: int = 0
    hits_per_request: list[int] = dataclasses.field(default_factory=list)
    ttl_s: float | None = None
    low_blocks: int | None = None

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("hits_per_request")
        d["hit_rate"] = self.hit_rate
        return d


def low_of(capacity_blocks: int, low_watermark: float) -> int:
    return max(0, min(capacity_blocks, math.floor(capacity_blocks * low_watermark)))


def replay(accesses: Sequence[Access], policy: str, capacity_blocks: int, *, low_blocks: int | None = None,
           ttl_s: float = 3600.0, admission: str = "always", pass_s: float = PASS_S) -> ReplayResult:
    """Replay accesses through the agent's Requester, eviction policy (lru, timer, both) and Admission
    (see the module doc). The policy `on_reuse` is lru with admission on_reuse."""
    if policy == "on_reuse":
        policy, admission = "lru", "on_reuse"
    if policy not in ("lru", "timer", "both"):
        raise ValueError(f"unknown policy {policy!r} (lru, timer, both or on_reuse)")
    if capacity_blocks < 0:
        raise ValueError("capacity_blocks must not be negative")
    high = capacity_blocks
    low = high if low_blocks is None else low_blocks
    index, evict, admit = Requester(), make_policy(policy, high, low, ttl_s), Admission(admission)
    label = policy if admission == "always" else f"{policy}+{admission}"
    result = ReplayResult(label, capacity_blocks, ttl_s=ttl_s if policy != "lru" else None, low_blocks=low)
    evictions = result.evictions

    def run_victims(now: float) -> None:
        for key, reason in evict.victims(now, index.leased):
            index.remove(key)
            evictions[reason] = evictions.get(reason, 0) + 1

    next_pass = -math.inf
    for a in accesses:
        now = a.time_s
        if now >= next_pass:  # the timer's pass (and a capacity pass, as the loop's would be)
            run_victims(now)
            next_pass = _next_pass(now, pass_s)
        hits = 0
        for key in a.blocks[:a.lookup]:
            if not index.has(key):
                break
            hits += 1
        names = a.blocks[:hits]
        index.touch(names, now)
        for key in names:
            evict.touch(key, 1, now)
        result.hits += hits
        result.lookups += a.lookup
        result.hits_per_request.append(hits)
        parent = a.blocks[hits - 1] if hits else b""
        for i in range(hits, len(a.blocks)):
            key = a.blocks[i]
            if not admit.admit(key, index.has):
                result.puts_skipped += 1
                parent = key
                continue
            index.publish(_stored(key, parent, i), a.context, "u0", now)
            evict.touch(key, 1, now)
            result.puts += 1
            parent = key
            if evict.over_capacity:
                run_victims(now)
            result.peak_blocks = max(result.peak_blocks, len(index))
    return result


def _stored(key: Hashable, parent: Hashable, index: int) -> StoredBlock:
    """A StoredBlock of one unit (the replay's names are trace ids, not hashes: the index only keys them)."""
    return StoredBlock(hash=key, parent=parent, tenant="default", user_id="u0",  # type: ignore[arg-type]
                       shared=False, chunk_index=index, token_count=0, storage_node="sim", key=b"", length=1,
                       crc32c=0)


# -- bounds ------------------------------------------------------------------------------------------

def working_set(accesses: Sequence[Access]) -> int:
    """Distinct blocks the trace stores: what an unbounded cache holds at its end."""
    return len({k for a in accesses for k in a.blocks})


def ideal(accesses: Sequence[Access]) -> ReplayResult:
    """Unbounded capacity, every block admitted: the trace's own reuse, the ceiling of every curve."""
    result = replay(accesses, "lru", INFINITE)
    result.policy = "ideal"
    return result


def belady(accesses: Sequence[Access], capacity_blocks: int) -> ReplayResult:
    """Belady's MIN with bypass (see the module doc): the most looked-up blocks any cache of
    capacity_blocks can hold when they are looked up. `hits` counts every looked-up block present;
    hits_per_request too."""
    uses: dict[Hashable, list[int]] = {}
    for i, a in enumerate(accesses):
        for key in a.blocks[:a.lookup]:
            uses.setdefault(key, []).append(i)
    pointer: dict[Hashable, int] = {}

    def next_use(key: Hashable, after: int) -> int:
        """The first request after `after` that looks key up (INFINITE: none)."""
        seq = uses.get(key)
        if not seq:
            return INFINITE
        p = pointer.get(key, 0)
        while p < len(seq) and seq[p] <= after:
            p += 1
        pointer[key] = p
        return seq[p] if p < len(seq) else INFINITE

    cached: dict[Hashable, int] = {}   # key -> its next use
    heap: list[tuple[int, int, Hashable]] = []  # (-next use, tie, key); stale entries skipped
    tie = 0
    result = ReplayResult("belady", capacity_blocks)
    for i, a in enumerate(accesses):
        hits = sum(1 for key in a.blocks[:a.lookup] if key in cached)
        result.hits += hits
        result.lookups += a.lookup
        result.hits_per_request.append(hits)
        for key in dict.fromkeys(a.blocks):  # each block the turn touches: keep it if it pays
            nxt = next_use(key, i)
            if key in cached:
                cached[key] = nxt
                tie += 1
                heapq.heappush(heap, (-nxt, tie, key))
                continue
            if nxt == INFINITE or capacity_blocks == 0:
                continue
            if len(cached) >= capacity_blocks:
                while heap and (heap[0][2] not in cached or cached[heap[0][2]] != -heap[0][0]):
                    heapq.heappop(heap)
                far = -heap[0][0]
                if far <= nxt:
                    continue  # bypass: what is held is needed sooner
                _, _, victim = heapq.heappop(heap)
                del cached[victim]
                result.evictions["belady"] = result.evictions.get("belady", 0) + 1
            cached[key] = nxt
            tie += 1
            heapq.heappush(heap, (-nxt, tie, key))
            result.puts += 1
        result.peak_blocks = max(result.peak_blocks, len(cached))
    return result


# -- timers --------------------------------------------------------------------------------------------

def reuse_gaps(accesses: Sequence[Access]) -> list[float]:
    """Seconds between a looked-up block's use and its previous use (lookup or store), per reuse."""
    last: dict[Hashable, float] = {}
    gaps = []
    for a in accesses:
        for key in a.blocks[:a.lookup]:
            if key in last:
                gaps.append(a.time_s - last[key])
        for key in a.blocks:
            last[key] = a.time_s
    return gaps


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _next_pass(now: float, pass_s: float) -> float:
    return (math.floor(now / pass_s) + 1) * pass_s if pass_s > 0 else -math.inf


def timer_peak(accesses: Sequence[Access], ttl_s: float, pass_s: float = PASS_S) -> int:
    """The most blocks the idle timer alone holds at once with this TTL, its passes as replay's
    (every block admitted: a block's last use is its request's time, hit or not, so no replay)."""
    order: collections.OrderedDict[Hashable, float] = collections.OrderedDict()  # last use, oldest first
    peak, next_pass = 0, -math.inf
    for a in accesses:
        if a.time_s >= next_pass:
            while order:
                key, last = next(iter(order.items()))
                if a.time_s - last <= ttl_s:
                    break
                order.popitem(last=False)
            next_pass = _next_pass(a.time_s, pass_s)
        for key in a.blocks:
            order[key] = a.time_s
            order.move_to_end(key)
        peak = max(peak, len(order))
    return peak


def timer_ttl_for(accesses: Sequence[Access], capacity_blocks: int, iterations: int = 16,
                  pass_s: float = PASS_S) -> float:
    """The longest TTL whose idle timer alone never holds more than capacity_blocks (bisection on
    timer_peak; twice the trace's span when every block fits; MIN_TTL_S when none does: the
    product's timer refuses a TTL of 0)."""
    span = max(accesses[-1].time_s - accesses[0].time_s, 1e-3) if accesses else 1.0
    if timer_peak(accesses, span * 2, pass_s) <= capacity_blocks:
        return span * 2
    lo, hi = 0.0, span * 2
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if timer_peak(accesses, mid, pass_s) <= capacity_blocks:
            lo = mid
        else:
            hi = mid
    return max(lo, MIN_TTL_S)
