"""Eviction on the NIC CPU: LRU by capacity and by idle timer (pure; the clock is passed in).

A policy tracks stored blocks (their size and last use) and names victims; the agent deletes a
victim from the storage nodes and its index. A leased block (being restored) is never named.
"""
from __future__ import annotations

import abc
import collections
from collections.abc import Callable, Hashable, Sequence

Leased = Callable[[Hashable], bool]


class EvictionPolicy(abc.ABC):
    """Which contexts to evict. Not thread-safe: the agent serialises calls."""

    reason: str = ""

    @property
    def over_capacity(self) -> bool:
        """Whether a victims() call now would evict for capacity (the agent runs one at once)."""
        return False

    @abc.abstractmethod
    def touch(self, key: Hashable, size_bytes: int, now: float) -> None:
        """Record a use of `key` (or its new size)."""

    @abc.abstractmethod
    def remove(self, key: Hashable) -> None:
        """Forget `key` (evicted or dropped)."""

    @abc.abstractmethod
    def victims(self, now: float, leased: Leased = lambda key: False) -> list[tuple[Hashable, str]]:
        """(key, reason) to evict now, oldest first; the policy forgets them."""


class LruCapacity(EvictionPolicy):
    """Past `high_bytes`, evict least recently used contexts until at most `low_bytes`."""

    reason = "capacity"

    def __init__(self, high_bytes: int, low_bytes: int):
        if not 0 <= low_bytes <= high_bytes:
            raise ValueError(f"need 0 <= low <= high watermark, got low {low_bytes}, high {high_bytes}")
        self.high_bytes, self.low_bytes = high_bytes, low_bytes
        self._sizes: collections.OrderedDict[Hashable, int] = collections.OrderedDict()
        self.total_bytes = 0

    @property
    def over_capacity(self) -> bool:
        return self.total_bytes > self.high_bytes

    def touch(self, key, size_bytes, now):
        self.total_bytes += size_bytes - self._sizes.get(key, 0)
        self._sizes[key] = size_bytes
        self._sizes.move_to_end(key)

    def remove(self, key):
        self.total_bytes -= self._sizes.pop(key, 0)

    def victims(self, now, leased=lambda key: False):
        if self.total_bytes <= self.high_bytes:
            return []
        out = []
        for key in list(self._sizes):
            if self.total_bytes <= self.low_bytes:
                break
            if not leased(key):
                self.remove(key)
                out.append((key, self.reason))
        return out


class IdleTimer(EvictionPolicy):
    """Evict contexts not used for more than `ttl_s`."""

    reason = "ttl"

    def __init__(self, ttl_s: float):
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self._last: collections.OrderedDict[Hashable, float] = collections.OrderedDict()

    def touch(self, key, size_bytes, now):
        self._last[key] = now
        self._last.move_to_end(key)

    def remove(self, key):
        self._last.pop(key, None)

    def victims(self, now, leased=lambda key: False):
        out = []
        for key, last in list(self._last.items()):
            if now - last <= self.ttl_s:
                break  # ordered by last use
            if not leased(key):
                self.remove(key)
                out.append((key, self.reason))
        return out


class Combined(EvictionPolicy):
    """Several policies at once; a victim of one is forgotten by all."""

    def __init__(self, policies: Sequence[EvictionPolicy]):
        self.policies = list(policies)

    @property
    def over_capacity(self) -> bool:
        return any(p.over_capacity for p in self.policies)

    def touch(self, key, size_bytes, now):
        for p in self.policies:
            p.touch(key, size_bytes, now)

    def remove(self, key):
        for p in self.policies:
            p.remove(key)

    def victims(self, now, leased=lambda key: False):
        out = []
        for p in self.policies:
            for key, reason in p.victims(now, leased):
                self.remove(key)
                out.append((key, reason))
        return out


def make_policy(kind: str, high_bytes: int, low_bytes: int, ttl_s: float) -> EvictionPolicy:
    """`lru`, `timer` or `both`."""
    if kind == "lru":
        return LruCapacity(high_bytes, low_bytes)
    if kind == "timer":
        return IdleTimer(ttl_s)
    if kind == "both":
        return Combined([LruCapacity(high_bytes, low_bytes), IdleTimer(ttl_s)])
    raise ValueError(f"unknown eviction policy {kind!r} (lru, timer or both)")
