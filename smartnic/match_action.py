"""A P4Runtime-like match-action table for requests entering the agent (pure).

Fields: "user_id", "context_id" (exact; absent = wildcard), "src_addr" (lpm), and
"src_port", "dst_addr", "dst_port", "protocol" (ternary: value & mask). Among the entries
that match, the highest priority wins, then the earliest inserted. No match: the default
action. Every lookup counts a hit on the entry (or on the default).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import itertools
from collections.abc import Mapping
from typing import Any

EXACT_FIELDS = ("user_id", "context_id")
LPM_FIELDS = ("src_addr",)
TERNARY_FIELDS = ("src_port", "dst_addr", "dst_port", "protocol")
FORWARD, PREFETCH_KV, DENY, RATE_LIMIT = "FORWARD", "PREFETCH_KV", "DENY", "RATE_LIMIT"
ACTIONS = (FORWARD, PREFETCH_KV, DENY, RATE_LIMIT)


class TableError(ValueError):
    """A malformed entry, an unknown field or entry id."""


def addr_int(value: Any) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(ipaddress.ip_address(str(value)))
    except ValueError as exc:
        raise TableError(f"not an address: {value!r}") from exc


@dataclasses.dataclass(frozen=True)
class Match:
    """One field's match: kind is "exact", "lpm" or "ternary"."""

    field: str
    kind: str
    value: Any
    mask_or_len: int = 0

    def __post_init__(self):
        allowed = {"exact": EXACT_FIELDS, "lpm": LPM_FIELDS, "ternary": TERNARY_FIELDS}.get(self.kind)
        if allowed is None or self.field not in allowed:
            raise TableError(f"field {self.field!r} cannot be matched as {self.kind!r}")
        if self.kind == "lpm":
            ipaddress.ip_network(f"{self.value}/{self.mask_or_len}", strict=False)

    def matches(self, packet: Mapping[str, Any]) -> bool:
        got = packet.get(self.field)
        if got is None:
            return False
        if self.kind == "exact":
            return str(got) == str(self.value)
        if self.kind == "lpm":
            try:
                network = ipaddress.ip_network(f"{self.value}/{self.mask_or_len}", strict=False)
                return ipaddress.ip_address(str(got)) in network
            except ValueError:
                return False
        value = addr_int(got) if self.field == "dst_addr" else int(got)
        want = addr_int(self.value) if self.field == "dst_addr" else int(self.value)
        return value & self.mask_or_len == want & self.mask_or_len


@dataclasses.dataclass
class Action:
    type: str = PREFETCH_KV
    compute_node: str = ""
    rate_per_s: float = 0.0
    burst: int = 0

    def __post_init__(self):
        if self.type not in ACTIONS:
            raise TableError(f"unknown action {self.type!r}")


@dataclasses.dataclass
class TokenBucket:
    """Rate limit: `rate_per_s` tokens a second, at most `burst` saved up."""

    rate_per_s: float
    burst: int
    tokens: float = -1.0
    last: float = 0.0

    def allow(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.last = float(max(self.burst, 1)), now
        self.tokens = min(float(max(self.burst, 1)), self.tokens + (now - self.last) * self.rate_per_s)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclasses.dataclass
class Entry:
    matches: tuple[Match, ...]
    priority: int
    action: Action
    entry_id: int = 0
    hit_count: int = 0
    bucket: TokenBucket | None = None


@dataclasses.dataclass
class Decision:
    """The outcome of one lookup: the action, and whether a rate limit refused it."""

    action: Action
    entry_id: int = 0  # 0: the default action
    over_limit: bool = False


class Table:
    """Entries by id. Not thread-safe: the agent serialises calls."""

    def __init__(self, name: str, default: Action | None = None):
        self.name = name
        self.default = default or Action(PREFETCH_KV)
        self.default_hits = 0
        self.entries: dict[int, Entry] = {}
        self._ids = itertools.count(1)

    def insert(self, entry: Entry) -> int:
        entry.entry_id = next(self._ids)
        entry.hit_count = 0
        entry.bucket = self._bucket(entry.action)
        self.entries[entry.entry_id] = entry
        return entry.entry_id

    def modify(self, entry: Entry) -> int:
        old = self._get(entry.entry_id)
        entry.hit_count = old.hit_count
        entry.bucket = self._bucket(entry.action)
        self.entries[entry.entry_id] = entry
        return entry.entry_id

    def delete(self, entry_id: int) -> int:
        self._get(entry_id)
        del self.entries[entry_id]
        return entry_id

    def _get(self, entry_id: int) -> Entry:
        if entry_id not in self.entries:
            raise TableError(f"table {self.name!r} has no entry {entry_id}")
        return self.entries[entry_id]

    @staticmethod
    def _bucket(action: Action) -> TokenBucket | None:
        return TokenBucket(action.rate_per_s, action.burst) if action.type == RATE_LIMIT else None

    def lookup(self, packet: Mapping[str, Any], now: float) -> Decision:
        """Match `packet` (field -> value), count the hit, apply a rate limit's bucket."""
        best = None
        for entry in self.entries.values():  # insertion order: the earliest wins a tie
            if (best is None or entry.priority > best.priority) and \
                    all(m.matches(packet) for m in entry.matches):
                best = entry
        if best is None:
            self.default_hits += 1
            return Decision(self.default)
        best.hit_count += 1
        over = best.bucket is not None and not best.bucket.allow(now)
        return Decision(best.action, best.entry_id, over)
