"""Statistics for benchmark results: mean, median, percentiles, summaries and ratios.

Percentiles use linear interpolation between closest ranks (Hyndman and Fan's type 7, NumPy's
default `method="linear"`, Excel's PERCENTILE.INC): for n sorted values x[0..n-1] and q in
[0, 100], the rank is h = (n - 1) * q / 100 and the result is
x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]). So p50 is the median, p0 the
minimum and p100 the maximum; with few samples p99 lies between the two largest values.
"""
from __future__ import annotations

import logging
import math
from typing import Iterable, Sequence

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


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values (for averaging ratios)."""
    vals = _values(values)
    if any(v <= 0 for v in vals):
        raise ValueError("geomean needs positive values")
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))


def bytes_per_s(num_bytes: float, seconds: float) -> float:
    """Throughput in bytes per second (inf for zero time)."""
    return ratio(num_bytes, seconds)
