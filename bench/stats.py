"""Statistics of benchmark results: mean, percentiles, summaries, ratios, the restore/recompute crossover.

Percentiles use linear interpolation between closest ranks (Hyndman and Fan's type 7, NumPy's
default `method="linear"`, Excel's PERCENTILE.INC): for n sorted values x[0..n-1] and q in
[0, 100], the rank is h = (n - 1) * q / 100 and the result is
x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]). So p50 is the median, p0 the
minimum and p100 the maximum; with few samples p99 lies between the two largest values.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence

logger = logging.getLogger(__name__)


def _values(values: Iterable[float]) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise ValueError("no values")
    return out


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; raises ValueError on no values."""
    vals = _values(values)
    return math.fsum(vals) / len(vals)


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100), linear interpolation between closest ranks (type 7)."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    vals = sorted(_values(values))
    h = (len(vals) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (h - lo) * (vals[hi] - vals[lo])


def median(values: Iterable[float]) -> float:
    """The median (the 50th percentile)."""
    return percentile(values, 50.0)


def stdev(values: Iterable[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator); 0.0 for a single value."""
    vals = _values(values)
    if len(vals) == 1:
        return 0.0
    m = mean(vals)
    return math.sqrt(math.fsum((v - m) ** 2 for v in vals) / (len(vals) - 1))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Return {n, mean, p50, p99, min, max, stdev} of values."""
    vals = _values(values)
    return {
        "n": len(vals),
        "mean": mean(vals),
        "p50": percentile(vals, 50.0),
        "p99": percentile(vals, 99.0),
        "min": min(vals),
        "max": max(vals),
        "stdev": stdev(vals),
    }


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; inf when only the denominator is 0, nan when both are."""
    if denominator == 0:
        return math.nan if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / denominator


def crossover(sizes: Sequence[int], recompute_s: Sequence[float], restore_s: Sequence[float]) -> dict:
    """The context length where recomputing costs as much as restoring (the poster's question).

    Below it recomputing is at least as fast. Interpolates the ratio recompute/restore
    linearly in log2(tokens) between the two measured sizes around 1.0. Returns
    {"tokens": float | None, "where": "measured" | "below_smallest" | "above_largest"}.
    """
    points = sorted(zip(sizes, recompute_s, restore_s))
    if not points:
        raise ValueError("no sizes")
    ratios = [(n, rc / rs) for n, rc, rs in points]
    if ratios[0][1] >= 1.0:
        return {"tokens": None, "where": "below_smallest", "smallest": ratios[0][0]}
    for (n0, r0), (n1, r1) in zip(ratios, ratios[1:]):
        if r0 < 1.0 <= r1:
            x0, x1 = math.log2(n0), math.log2(n1)
            return {"tokens": 2.0 ** (x0 + (1.0 - r0) * (x1 - x0) / (r1 - r0)), "where": "measured"}
    return {"tokens": None, "where": "above_largest", "largest": ratios[-1][0]}


def hit_rate(hits: int, follow_ups: int) -> float:
    """Fraction of follow-ups whose KV was restored (0.0 with no follow-ups)."""
    return hits / follow_ups if follow_ups else 0.0
