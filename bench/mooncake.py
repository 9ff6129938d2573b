"""Traces in the Mooncake FAST'25 format: parsing, a synthetic generator, scaling and the ideal hit rate (pure).

One JSON object per line: `timestamp` (ms from the trace's start), `input_length` and
`output_length` (tokens), `hash_ids` (one id per block of the prompt, 512 tokens in Mooncake's
traces; the last block may be partial). Equal ids are equal blocks; Mooncake's ids are prefix
hashes, so an id names its block and everything before it. Nothing else in a line is read.

The ideal a block-granular prefix cache can reach: a request's longest leading run of full blocks
whose whole prefix (the ids up to and including that block) appeared in an earlier request of the
same user, never all of the prompt (one token must be computed to produce the first output). KV is
salted per user, so users share nothing. `kvtb bench replay` sends a trace as several users
(`users_of`: the requests that begin with the same block, a synthetic trace's group, are one
user's; such groups are dealt round-robin to the users), so no prefix is shared across users and
the ideal per user is the trace's own. A request's ideal assumes a cache of unbounded capacity
that has stored every block of every earlier request by the time the request arrives.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A line that is not a request of the format."""


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request of a trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json(self) -> str:
        ts = int(self.timestamp_ms) if float(self.timestamp_ms).is_integer() else self.timestamp_ms
        return json.dumps({"timestamp": ts, "input_length": self.input_length,
                           "output_length": self.output_length, "hash_ids": list(self.hash_ids)})


def _field(obj: dict, name: str, kind: type, where: str):
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
        raise TraceError(f"{where}: `{name}` must be {'a number' if kind is float else 'an integer'}, got {value!r}")
    return value


def parse_line(line: str, where: str = "line") -> TraceRequest:
    """One request from one JSON line (TraceError when it is not one)."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise TraceError(f"{where}: not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: not a JSON object")
    ts = _field(obj, "timestamp", float, where)
    n_in, n_out = _field(obj, "input_length", int, where), _field(obj, "output_length", int, where)
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TraceError(f"{where}: `hash_ids` must be a non-empty list of integers")
    if n_in < 1 or n_out < 0 or ts < 0:
        raise TraceError(f"{where}: need input_length >= 1, output_length >= 0, timestamp >= 0")
    return TraceRequest(float(ts), n_in, n_out, tuple(ids))


def parse_trace(lines: Iterable[str]) -> list[TraceRequest]:
    """Every request of a JSONL text (blank lines skipped), sorted by timestamp (stable)."""
    out = [parse_line(line, f"line {i}") for i, line in enumerate(lines, 1) if line.strip()]
    return sorted(out, key=lambda r: r.timestamp_ms)


def load_trace(path: str | Path) -> list[TraceRequest]:
    with open(path, encoding="utf-8") as f:
        return parse_trace(f)


def dump_trace(requests: Sequence[TraceRequest]) -> str:
    """The JSONL text of requests (Mooncake's field names)."""
    return "".join(r.to_json() + "\n" for r in requests)


def check_blocks(requests: Sequence[TraceRequest], block_tokens: int) -> None:
    """TraceError unless each request's hash_ids cover its input_length in blocks of block_tokens."""
    for i, r in enumerate(requests):
        if not (len(r.hash_ids) - 1) * block_tokens < r.input_length <= len(r.hash_ids) * block_tokens:
            raise TraceError(f"request {i}: {len(r.hash_ids)} hash ids of {block_tokens} tokens cannot hold "
                             f"input_length {r.input_length} (is --source-block-tokens the trace's block size?)")


def synthetic_trace(n: int, seed: int = 0, groups: int = 0, block_tokens: int = MOONCAKE_BLOCK_TOKENS,
                    gap_ms: tuple[float, float] = (500.0, 2000.0), shared_blocks: tuple[int, int] = (3, 8),
                    own_blocks: tuple[int, int] = (1, 3), output_tokens: tuple[int, int] = (64, 256)
                    ) -> list[TraceRequest]:
    """n requests in `groups` groups (default about n / 5), each group's requests sharing its 3-8 leading
    blocks, then 1-3 blocks of their own (the last partial); uniform gaps between arrivals. Ids
    are prefix ids as in Mooncake's traces: a shared block has one id, an own block a fresh one."""
    rng = random.Random(seed)
    groups = groups or max(1, (n + 2) // 5)
    next_id = 0

    def fresh(count: int) -> list[int]:
        nonlocal next_id
        next_id += count
        return list(range(next_id - count, next_id))

    prefixes = [fresh(rng.randint(*shared_blocks)) for _ in range(groups)]
    order = [i % groups for i in range(n)]
    rng.shuffle(order)
    out, t = [], 0.0
    for g in order:
        ids = prefixes[g] + fresh(rng.randint(*own_blocks))
        length = (len(ids) - 1) * block_tokens + rng.randint(1, block_tokens)
        out.append(TraceRequest(round(t), length, rng.randint(*output_tokens), tuple(ids)))
        t += rng.uniform(*gap_ms)
    return out


def scale(requests: Sequence[TraceRequest], source_block_tokens: int, block_tokens: int) -> list[TraceRequest]:
    """Lengths scaled from the trace's block size to block_tokens (ids and timestamps kept): a
    request keeps its number of blocks; its last block keeps its share of a block, at least 1 token."""
    out = []
    for r in requests:
        full = len(r.hash_ids) - 1
        last = r.input_length - full * source_block_tokens
        last = min(block_tokens, max(1, round(last * block_tokens / source_block_tokens)))
        out_len = max(1, round(r.output_length * block_tokens / source_block_tokens)) if r.output_length else 0
        out.append(dataclasses.replace(r, input_length=full * block_tokens + last, output_length=out_len))
    return out


def users_of(requests: Sequence[TraceRequest], users: int = 0) -> list[int]:
    """Per request, its user (0 .. users-1): the requests whose first block is the same (a group
    sharing a prefix) are one user's, the groups dealt round-robin in order of first appearance;
    users=0: a user per group. Prefixes never cross users."""
    groups: dict[int, int] = {}
    out = []
    for r in requests:
        g = groups.setdefault(r.hash_ids[0], len(groups))
        out.append(g % users if users > 0 else g)
    return out


def ideal_blocks(requests: Sequence[TraceRequest], block_tokens: int,
                 users: Sequence[int] | None = None) -> list[int]:
    """Per request, its leading full blocks whose prefix an earlier request of the same user had
    (see the module doc); users: each request's user (default: all one user's)."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = []
    for i, r in enumerate(requests):
        user = users[i] if users is not None else 0
        usable = (r.input_length - 1) // block_tokens  # full blocks, and a token left to compute
        k = 0
        while k < min(usable, len(r.hash_ids)) and (user, r.hash_ids[:k + 1]) in seen:
            k += 1
        out.append(k)
        seen.update((user, r.hash_ids[:j + 1]) for j in range(len(r.hash_ids)))
    return out


def seen_id_share(requests: Sequence[TraceRequest]) -> float:
    """The share of all blocks whose id appeared in an earlier request (the trace's own reuse figure)."""
    seen: set[int] = set()
    hits = total = 0
    for r in requests:
        hits += sum(1 for i in r.hash_ids if i in seen)
        total += len(r.hash_ids)
        seen.update(r.hash_ids)
    return hits / total if total else 0.0
