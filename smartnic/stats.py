"""The agent's statistics: counters, counts by kind, and a window of latency samples."""
from __future__ import annotations

import collections
import threading

import numpy as np

from kvtb.metrics import histogram


class Stats:
    """Thread-safe (one lock); latency percentiles over the last `window` samples."""

    def __init__(self, window: int = 10_000):
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._latency_us: collections.deque[float] = collections.deque(maxlen=window)

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def inc_kind(self, group: str, kind: str, n: int = 1) -> None:
        with self._lock:
            self.by_kind[group][kind] += n

    def latency(self, microseconds: float) -> None:
        """A trigger-to-fire sample (also observed by the kvtb:trigger_to_fire_seconds histogram)."""
        with self._lock:
            self._latency_us.append(microseconds)
        histogram("trigger_to_fire_seconds").observe(microseconds / 1e6)

    def percentiles(self) -> tuple[float, float]:
        """(p50, p99) of the trigger-to-fire latency in µs; zeros before any sample."""
        with self._lock:
            samples = np.array(self._latency_us, dtype=np.float64)
        if samples.size == 0:
            return 0.0, 0.0
        p50, p99 = np.percentile(samples, [50, 99])
        return float(p50), float(p99)

    def snapshot(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        with self._lock:
            return dict(self.counts), {g: dict(c) for g, c in self.by_kind.items()}
