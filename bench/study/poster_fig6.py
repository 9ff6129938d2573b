"""The poster's Fig. 6 pattern, measured on one batch's samples (pure: no services, no clock).

The seed: at 12% of the memory, "GPU usage decreases when eviction happens and increases when evicted
requests are resumed", and throughput "increases periodically" because waiting (and resumed) requests
are processed. One batch gives, every POLL_S, a sample (t, usage, running, waiting, preemptions so far)
and a throughput series (t, tokens/s). An interval is the time between two consecutive samples:

- its preemptions: the rise of the preemption count; its admissions: preemptions minus the change of the
  waiting count (a resumed request or a first admission: the node's Stats do not tell them apart);
- a throughput rise: a bin whose rate exceeds the bin before by at least `rise_frac` of the series' mean.
"""
from __future__ import annotations

from collections.abc import Sequence

Sample = Sequence[float]  # (t, usage 0-1, running, waiting, preemptions so far)
RISE_FRAC = 0.25


def _intervals(samples: Sequence[Sample]):
    for a, b in zip(samples, samples[1:]):
        yield {"du": b[1] - a[1], "dp": b[4] - a[4], "dw": b[3] - a[3], "t0": a[0], "t1": b[0]}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """a x = b for a 3x3 system by Gaussian elimination with pivoting; None when singular."""
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(3):
        p = max(range(c, 3), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(3):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[k][3] / m[k][k] for k in range(3)]


def usage_per_event(samples: Sequence[Sample]) -> dict[str, float] | None:
    """How KV usage moves per preemption and per admission, from the first preemption on.

    In an interval, preemptions = the rise of the preemption count, admissions = preemptions - the change of
    the waiting count (a victim joins the waiting queue; an admission leaves it; every request arrived at
    the start). Several of each fall in one 0.25 s interval, so the change of usage is fitted by least
    squares as intercept + per_preemption x preemptions + per_admission x admissions (the intercept takes the
    running sequences' growth and the finishes). None with fewer than 4 intervals or no spread to fit."""
    rows = []
    for i in _intervals(samples):
        if i["dp"] > 0 or rows:
            rows.append((1.0, float(i["dp"]), float(max(0, i["dp"] - i["dw"])), i["du"]))
    if len(rows) < 4:
        return None
    xtx = [[sum(r[j] * r[k] for r in rows) for k in range(3)] for j in range(3)]
    xty = [sum(r[j] * r[3] for r in rows) for j in range(3)]
    coef = _solve3(xtx, xty)
    if coef is None:
        return None
    return {"per_preemption": coef[1], "per_admission": coef[2], "intervals": len(rows)}


def rises(series: Sequence[tuple[float, float]], rise_frac: float = RISE_FRAC) -> list[float]:
    """The start times of the bins whose rate rose by at least rise_frac of the mean over the bin before."""
    if rise_frac <= 0:
        raise ValueError(f"rise_frac must be positive, got {rise_frac}")
    values = [v for _, v in series]
    mean = _mean(values) or 0.0
    if mean <= 0:
        return []
    return [t for (_, a), (t, b) in zip(series, series[1:]) if b - a >= rise_frac * mean]


def extra_rises(tight: Sequence[tuple[float, float]], ample: Sequence[tuple[float, float]]) -> int:
    """Throughput rises of the batch at a tight pool beyond those of the same batch on an ample pool (the
    ramp-up of a batch that never preempts): the periodic rises preemption brings."""
    return len(rises(tight)) - len(rises(ample))


def rises_with_admissions(series: Sequence[tuple[float, float]], samples: Sequence[Sample],
                          bin_s: float) -> float | None:
    """The share of throughput rises during which waiting requests were admitted (an interval with admissions
    between the bin before the rise and the rise's bin); None without a rise."""
    up = rises(series)
    if not up:
        return None
    hit = 0
    for t in up:
        window = [s for s in samples if t - bin_s <= s[0] <= t + bin_s]
        if any((b[4] - a[4]) - (b[3] - a[3]) > 0 for a, b in zip(window, window[1:])):
            hit += 1
    return hit / len(up)
