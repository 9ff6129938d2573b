"""Pure helpers of the benchmarks: the restore/recompute crossover, Zipf draws, reply comparison."""
from __future__ import annotations

import logging
import math
import random
from typing import Mapping, Sequence

logger = logging.getLogger(__name__)


def crossover(sizes: Sequence[int], recompute_s: Sequence[float], restore_s: Sequence[float]) -> dict:
    """The context length where recomputing costs as much as restoring (the poster's question).

    Below it recomputing is at least as fast. Interpolates the ratio recompute/restore
    linearly in log2(tokens) between the two measured sizes around 1.0. Returns
    {"tokens": float | None, "where": "measured" | "below_smallest" | "above_largest"}.
    """
    points = sorted(zip(sizes, recompute_s, restore_s))
    assert points, "no sizes"
    ratios = [(n, rc / rs) for n, rc, rs in points]
    if ratios[0][1] >= 1.0:
        return {"tokens": None, "where": "below_smallest", "smallest": ratios[0][0]}
    for (n0, r0), (n1, r1) in zip(ratios, ratios[1:]):
        if r0 < 1.0 <= r1:
            x0, x1 = math.log2(n0), math.log2(n1)
            x = x0 + (1.0 - r0) * (x1 - x0) / (r1 - r0)
            return {"tokens": 2.0 ** x, "where": "measured"}
    return {"tokens": None, "where": "above_largest", "largest": ratios[-1][0]}


def zipf_weights(count: int, s: float) -> list[float]:
    """Normalised Zipf weights 1/k^s for ranks 1..count."""
    raw = [1.0 / (k ** s) for k in range(1, count + 1)]
    total = math.fsum(raw)
    return [w / total for w in raw]


def zipf_schedule(users: int, visits: int, s: float, seed: int) -> list[int]:
    """Which user returns at each of `visits` visits: Zipf(s)-distributed, seeded."""
    rng = random.Random(seed)
    return rng.choices(range(users), weights=zipf_weights(users, s), k=visits)


def think_times(count: int, mean_s: float, seed: int) -> list[float]:
    """Exponential think times with the given mean, seeded."""
    rng = random.Random(seed)
    return [rng.expovariate(1.0 / mean_s) if mean_s > 0 else 0.0 for _ in range(count)]


def first_difference(expected: Mapping[str, Sequence[str]], got: Mapping[str, Sequence[str]]) -> list[str]:
    """Conversations whose replies differ from the reference: 'name turn i: expected ... got ...'."""
    out = []
    for name, want in expected.items():
        have = list(got.get(name, []))
        for i, reply in enumerate(want):
            if i >= len(have) or have[i] != reply:
                shown = have[i] if i < len(have) else "(no reply)"
                out.append(f"{name} turn {i + 1}: expected {reply!r}, got {shown!r}")
                break
    return out


def hit_rate(hits: int, follow_ups: int) -> float:
    """Fraction of follow-ups whose KV was restored (0.0 with no follow-ups)."""
    return hits / follow_ups if follow_ups else 0.0
