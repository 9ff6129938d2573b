"""Claims as data: the seed's words, what this testbed measures for them, and a verdict that can fail.

A study declares its claims in one table (a list of `Claim`). Each claim quotes the seed exactly (or
says it is our own hypothesis), names the seed's numbers, and says how one repeat's measurement is
judged: a `Test` (above, below or between a threshold, with a tolerance in the seed's favour). The
study's `evidence` function turns its results into one value per repeat (`Evidence`).

`verdict` is the only judge:

- fewer repeats than the claim needs (at least 3): **inconclusive**, whatever the values;
- the noise band is the 95% confidence half-width of the repeats' mean (Student's t);
- **agrees** when the whole band lies on the claim's side of the (tolerated) threshold;
- **disagrees** when the whole band lies on the other side;
- **inconclusive** otherwise.

A computed quantity (arithmetic, no timing: `Claim.noise = "none"`) has no noise band and needs one
value. `evaluate` adds the rest: a part that did not run is **not measured**, a claim valid only under
another hardware profile is **out of scope** (its measurement still shown), and a run whose dilation
was violated makes a judged claim **invalid** (report.invalidate).

Pure: no I/O, no clocks.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("agrees", "disagrees", "inconclusive", "not measured", "out of scope", "invalid")
JUDGED = ("agrees", "disagrees")
MIN_REPEATS = 3

# two-sided 95% Student t by degrees of freedom (1-30); 1.96 beyond
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


@dataclass(frozen=True)
class Test:
    """How one repeat's value is judged against the seed.

    kind: "above" (the claim holds when the value exceeds `threshold`), "below" (when it is under it)
    or "between" (`threshold` is (low, high)). `tolerance`, in the value's units, moves the threshold in
    the seed's favour (above: threshold - tolerance; below: + tolerance; between: the range widened)."""
    __test__ = False  # a claim's test, not pytest's
    kind: str
    threshold: float | tuple[float, float]
    tolerance: float = 0.0
    unit: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("above", "below", "between"):
            raise ValueError(f"Test kind {self.kind!r}: expected above, below or between")
        if self.kind == "between":
            low, high = self.threshold  # type: ignore[misc]
            if not low <= high:
                raise ValueError(f"Test between {low} and {high}: low must not exceed high")
        elif not isinstance(self.threshold, (int, float)):
            raise ValueError(f"Test {self.kind}: threshold must be a number, got {self.threshold!r}")
        if self.tolerance < 0:
            raise ValueError(f"Test tolerance {self.tolerance}: must not be negative")

    def bounds(self) -> tuple[float, float]:
        """The range of values for which the claim holds, tolerance applied."""
        if self.kind == "above":
            return float(self.threshold) - self.tolerance, math.inf  # type: ignore[arg-type]
        if self.kind == "below":
            return -math.inf, float(self.threshold) + self.tolerance  # type: ignore[arg-type]
        low, high = self.threshold  # type: ignore[misc]
        return float(low) - self.tolerance, float(high) + self.tolerance

    def text(self) -> str:
        """'> 19 (tolerance 1.9)', '< 0', 'in [19, 23]'."""
        u = f" {self.unit}" if self.unit else ""
        tol = f" (tolerance {self.tolerance:g}{u})" if self.tolerance else ""
        if self.kind == "between":
            low, high = self.threshold  # type: ignore[misc]
            return f"in [{low:g}, {high:g}]{u}{tol}"
        return f"{'>' if self.kind == 'above' else '<'} {self.threshold:g}{u}{tol}"


@dataclass(frozen=True)
class Evidence:
    """What one run measured for a claim: one value per repeat, and the text the page shows."""
    values: Sequence[float]
    text: str
    why: str = ""


@dataclass(frozen=True)
class Claim:
    """One row of a study's claims table.

    key: a stable id. figure: where the seed says it ("Fig. 5", "Sec. III-B"). words: the seed's exact
    words (or, when `source` is "hypothesis", ours, labelled so on the page). seed: the seed's numbers
    for it ("" when it gives none). measure: the value one repeat gives, in words. test: how it is judged.
    repeats: how many the verdict needs (at least 3 unless noise is "none"). profiles: the hardware
    profiles it is valid under ("" = this machine, no profile); None = any. evidence: results -> Evidence
    (None or an exception: not measured). why: the standing reason, beside the run's own."""
    key: str
    figure: str
    words: str
    measure: str
    test: Test
    evidence: Callable[[Mapping[str, Any]], Evidence | None]
    seed: str = ""
    repeats: int = MIN_REPEATS
    profiles: tuple[str, ...] | None = None
    source: str = "seed"
    noise: str = "measured"
    why: str = ""

    def __post_init__(self) -> None:
        if self.source not in ("seed", "hypothesis"):
            raise ValueError(f"claim {self.key}: source {self.source!r}: expected seed or hypothesis")
        if self.noise not in ("measured", "none"):
            raise ValueError(f"claim {self.key}: noise {self.noise!r}: expected measured or none")
        if self.noise == "measured" and self.repeats < MIN_REPEATS:
            raise ValueError(f"claim {self.key}: a measured claim needs at least {MIN_REPEATS} repeats, "
                             f"not {self.repeats}")
        if not self.words.strip() or not self.measure.strip():
            raise ValueError(f"claim {self.key}: words and measure must be given")


@dataclass(frozen=True)
class Band:
    """The repeats' mean and its noise band (95% confidence half-width)."""
    n: int
    mean: float
    band: float

    @property
    def low(self) -> float:
        return self.mean - self.band

    @property
    def high(self) -> float:
        return self.mean + self.band


def t95(df: int) -> float:
    """Two-sided 95% Student t for `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t95: degrees of freedom {df} < 1")
    return _T95[df - 1] if df <= len(_T95) else 1.96


def noise_band(values: Sequence[float]) -> Band:
    """The mean of the finite values and its 95% confidence half-width (inf with fewer than 2)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return Band(0, math.nan, math.inf)
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return Band(1, mean, math.inf)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return Band(len(xs), mean, t95(len(xs) - 1) * math.sqrt(var / len(xs)))


def verdict(values: Sequence[float], test: Test, repeats: int = MIN_REPEATS,
            noise: str = "measured") -> tuple[str, Band, str]:
    """(verdict, band, reason): agrees, disagrees or inconclusive, as the module says."""
    if noise == "none":
        b = noise_band(values)
        b = Band(b.n, b.mean, 0.0) if b.n else b
        need = 1
    else:
        b = noise_band(values)
        need = max(MIN_REPEATS, repeats)
    if b.n < need:
        return "inconclusive", b, f"{b.n} of the {need} repeats it needs"
    low, high = test.bounds()
    if low <= b.low and b.high <= high:
        return "agrees", b, f"{_band_text(b)} lies within the claim's range ({test.text()})"
    if b.high < low or b.low > high:
        return "disagrees", b, f"{_band_text(b)} lies outside the claim's range ({test.text()})"
    return "inconclusive", b, f"{_band_text(b)} straddles the claim's bound ({test.text()})"


def _band_text(b: Band) -> str:
    if b.band == 0:
        return f"{b.mean:.3g}"
    return f"{b.mean:.3g} ± {b.band:.2g} (n={b.n})"


def evaluate(claims: Sequence[Claim], results: Mapping[str, Any], profile: str = "",
             unmeasured: Callable[[Claim], str] | None = None) -> list[dict]:
    """Each claim's record for the study's JSON: the seed's words and numbers, the measurement, the test,
    the band and the verdict. `profile` is the run's ('' without one). `unmeasured(claim)` says why a claim
    has no evidence (default: its part did not run)."""
    records = []
    keys = set()
    for c in claims:
        if c.key in keys:
            raise ValueError(f"claim key {c.key!r} appears twice")
        keys.add(c.key)
        try:
            ev = c.evidence(results)
            error = ""
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            ev, error = None, f"{type(exc).__name__}: {exc}"
        record = {"key": c.key, "figure": c.figure, "claim": c.words, "seed": c.seed, "source": c.source,
                  "measure": c.measure, "test": {"kind": c.test.kind, "threshold": c.test.threshold,
                                                 "tolerance": c.test.tolerance, "text": c.test.text()},
                  "repeats": c.repeats, "profiles": list(c.profiles) if c.profiles is not None else None}
        if ev is None or not list(ev.values):
            why = (unmeasured(c) if unmeasured else "") or (f"not measured ({error})" if error else
                                                            "not measured: its part did not run")
            record.update(measured=(ev.text if ev is not None and ev.text else why), values=[],
                          band=None, verdict="not measured", why=_join(c.why, ev.why if ev else "", error))
            records.append(record)
            continue
        v, b, reason = verdict(ev.values, c.test, c.repeats, c.noise)
        if c.profiles is not None and profile not in c.profiles:
            where = ", ".join(p or "no profile" for p in c.profiles)
            v, reason = "out of scope", f"valid under {where}; this run: {profile or 'no profile'} ({reason})"
        record.update(measured=ev.text, values=[float(x) for x in ev.values],
                      band={"n": b.n, "mean": b.mean, "band": b.band}, verdict=v,
                      why=_join(reason, ev.why, c.why))
        records.append(record)
    return records


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def repeats_of(values: Sequence[Any], fn: Callable[[Any], float | None]) -> list[float]:
    """fn over each repeat's record, the Nones (a repeat that failed) left out."""
    out = []
    for v in values:
        x = fn(v)
        if x is not None and math.isfinite(x):
            out.append(float(x))
    return out


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ys over xs (a trend's sign and size, one repeat's series)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"slope: needs two or more paired points, got {len(xs)} and {len(ys)}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("slope: every x is the same")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def spread(ys: Sequence[float]) -> float:
    """(max - min) / mean of one repeat's series: how much a quantity moves over a sweep."""
    if not ys:
        raise ValueError("spread: no values")
    mean = sum(ys) / len(ys)
    if mean == 0:
        raise ValueError("spread: the mean is zero")
    return (max(ys) - min(ys)) / abs(mean)


@dataclass
class Tally:
    """How many claims came out each way (for a page's summary line and all.json)."""
    counts: dict[str, int] = field(default_factory=lambda: {v: 0 for v in VERDICTS})

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]]) -> "Tally":
        t = cls()
        for r in records:
            t.counts[r["verdict"]] = t.counts.get(r["verdict"], 0) + 1
        return t

    def text(self) -> str:
        return ", ".join(f"{n} {v}" for v, n in self.counts.items() if n)
