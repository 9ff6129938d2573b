"""The recompute-vs-swap poster's claims, as data (bench.study.claims), judged on the study's results.

Every claim with source "seed" quotes the poster exactly; its figure is the figure whose panel it
describes (the poster's text sits beside the figures, out of their order). Each evidence function is pure:
results -> one value per repeat. The overhead is the engine's own time in preemption work
(`engine_total_s`, bench.study.overhead); the end-to-end extra is reported beside it.

Claims that compare swap with recompute, or depend on how a copy's cost scales with its size, speak for the
poster's platform: a GPU whose KV crosses PCIe to host memory. Without a hardware profile a swap here is a
memcpy inside one process while recompute runs a 135M model on the CPU, so they are valid only under the
`polaris-a100` profile (out of scope without it; their measurement is still shown).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.study.claims import Claim, Evidence, Test, slope, spread

SEED = "recompute-vs-swap-poster.txt"
POSTER_PLATFORM = ("polaris-a100",)
METRIC = "engine_total_s"
FIG6_SHARE = 0.12   # "when avail. GPU Mem. is 12%"
LOWEST_AT = (0.3, 0.5)  # "is 30% or 50%"


# -- reading the results ---------------------------------------------------------------------------------

def _n(rows: Mapping[str, Any], strategies: Sequence[str]) -> int:
    ns = [len(by[s]["repeats"]) for by in rows.values() for s in strategies if (by or {}).get(s)]
    return min(ns) if ns else 0


def series(rows: Mapping[str, Any], strategy: str, key: str = METRIC, x_key: str | None = None,
           keep=lambda x: True) -> list[tuple[list[float], list[float]]]:
    """Per repeat: (xs, ys) of a strategy's quantity over a sweep (x: the sweep's key, or a per-repeat field)."""
    out = []
    for i in range(_n(rows, (strategy,))):
        pts = sorted((float(r["repeats"][i][x_key]) if x_key else float(x), float(r["repeats"][i][key]))
                     for x, by in rows.items() if (r := (by or {}).get(strategy)) and keep(float(x)))
        out.append(([x for x, _ in pts], [y for _, y in pts]))
    return out


def _fit(per_repeat, fn) -> list[float]:
    values = []
    for xs, ys in per_repeat:
        try:
            values.append(fn(xs, ys))
        except (ValueError, ZeroDivisionError):
            continue
    return [v for v in values if math.isfinite(v)]


def _mean_text(rows: Mapping[str, Any], strategy: str, unit: str = "s engine", key: str = METRIC,
               x_key: str | None = None) -> str:
    pts = sorted((float(by[strategy][x_key]) if x_key else float(x), by[strategy][key])
                 for x, by in rows.items() if (by or {}).get(strategy))
    xs = "evicted tokens " if x_key else ""
    return xs + ", ".join(f"{x:g}: {y:.3g}" for x, y in pts) + f" ({unit}, mean of repeats)"


def _too_few(rows: Mapping[str, Any], strategy: str, what: str) -> Evidence | None:
    """No trend to measure: None when the sweep did not run, else what it measured."""
    if not any((by or {}).get(strategy) for by in rows.values()):
        return None
    return Evidence([], f"{strategy}: {_mean_text(rows, strategy)}; a trend needs two or more {what}")


def _vals(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"


# -- evidence, one function per kind of claim ----------------------------------------------------------------

def flat_over_block_size(strategy: str):
    """Spread (max - min) / mean of the overhead across block sizes, per repeat."""
    def evidence(res: Mapping) -> Evidence | None:
        f2 = res.get("fig2", {})
        values = _fit(series(f2, strategy), lambda xs, ys: spread(ys) if len(xs) >= 2 else math.nan)
        if not values:
            return _too_few(f2, strategy, "block sizes")
        return Evidence(values, f"{strategy} by block size: {_mean_text(f2, strategy)}; spread per repeat "
                                f"{_vals(values)}", "recompute recomputes every evicted token (prefix cache off)")
    return evidence


def trend(fig: str, strategy: str, x_key: str | None = None, log2x: bool = False, per: float = 1.0,
          keep=lambda x: True, what: str = ""):
    """The least-squares slope of the overhead over a sweep's x (log2 x; x / per), per repeat."""
    def evidence(res: Mapping) -> Evidence | None:
        rows = res.get(fig, {})
        reps = [([math.log2(x) if log2x else x / per for x in xs], ys)
                for xs, ys in series(rows, strategy, x_key=x_key, keep=keep)]
        values = _fit(reps, lambda xs, ys: slope(xs, ys) if len(set(xs)) >= 2 else math.nan)
        if not values:
            return _too_few(rows, strategy, "points")
        return Evidence(values, f"{strategy} {what}: {_mean_text(rows, strategy, x_key=x_key)}; slope per repeat "
                                f"{_vals(values)}")
    return evidence


def recompute_minus_swap(fig: str, pick: str):
    """Recompute's overhead minus swap-host's at the sweep's point with the most evictions (Fig. 5: the
    smallest share) or the longest sequences (Fig. 4), per repeat; the end-to-end extra beside it."""
    def evidence(res: Mapping) -> Evidence | None:
        rows = {x: by for x, by in res.get(fig, {}).items() if (by or {}).get("recompute") and by.get("swap-host")}
        if not rows:
            return None
        x = min(rows, key=float) if pick == "smallest" else max(rows, key=float)
        rec, host = rows[x]["recompute"], rows[x]["swap-host"]
        values = [r[METRIC] - h[METRIC] for r, h in zip(rec["repeats"], host["repeats"])]
        return Evidence(values, f"at {x}: recompute {rec[METRIC]:.3g} s engine vs swap-host {host[METRIC]:.3g} s "
                                f"(difference per repeat {_vals(values)}); end to end: recompute "
                                f"{rec['extra_e2e_s']:+.3g} s, swap-host {host['extra_e2e_s']:+.3g} s")
    return evidence


def lowest_share(res: Mapping) -> Evidence | None:
    """Per repeat: how far the share with the lowest overhead lies from 30% or 50% (the worse strategy's);
    measured only when shares on both sides of 30-50% ran."""
    f5 = res.get("fig5", {})
    shares = sorted(float(x) for x in f5)
    if not shares or shares[0] >= LOWEST_AT[0] or shares[-1] <= LOWEST_AT[1]:
        return Evidence([], f"shares measured: {', '.join(f'{s:.0%}' for s in shares) or 'none'}",
                        "needs shares below 30% and above 50%: full mode")
    per = {s: series(f5, s) for s in ("recompute", "swap-host")}
    values = []
    for i in range(min(len(v) for v in per.values())):
        far = [min(abs(xs[ys.index(min(ys))] - t) for t in LOWEST_AT) for xs, ys in (per[s][i] for s in per)]
        values.append(max(far))
    return Evidence(values, f"recompute: {_mean_text(f5, 'recompute')}; swap-host: {_mean_text(f5, 'swap-host')}; "
                            f"distance of the lowest from 30%/50% per repeat {_vals(values)}")


def fig6(strategy: str, field: str, what: str):
    """A Fig. 6 pattern quantity (bench.study.poster_fig6) per repeat, at the 12% share."""
    def evidence(res: Mapping) -> Evidence | None:
        row = (res.get("fig6") or {}).get(strategy)
        if not row:
            return None
        values = [r[field] for r in row["repeats"] if r.get(field) is not None]
        why = "" if abs(row["share"] - FIG6_SHARE) < 0.01 else \
            f"at {row['share']:.0%} of the need, not the seed's 12% (this mode has no 12% point)"
        return Evidence(values, f"{strategy} at {row['share']:.0%}: {what} per repeat {_vals(values)} "
                                f"({row['preemptions']:.0f} preemptions a repeat)", why)
    return evidence


def pinned(res: Mapping) -> Evidence | None:
    """Never measured: neither this machine nor a profile has pinned memory to compare with pageable."""
    return Evidence([], "not applicable: no GPU and no pinned memory here; the host tier copies block extents "
                        "with memcpy")


# -- the table ------------------------------------------------------------------------------------------------

_ENGINE = "the engine's own time in preemption work (s)"
_FIT = ("; fitted over the 0.25 s intervals from the first preemption on: usage change = c + a x preemptions + "
        "b x admissions (bench.study.poster_fig6)")
_DROP = "change of KV usage (share of the pool) per preemption" + _FIT
_RISE = ("change of KV usage per admission of a waiting request (resumed or first admitted: the Stats do not "
         "tell them apart)" + _FIT)
_PERIODIC = ("throughput rises (a 1 s bin at least 25% of the mean above the one before) beyond those of the same "
             "batch on an ample pool")
_CAUSE = "share of the throughput rises during which waiting requests were admitted"
_COPY = ("a swap's cost depends on the copy: on the poster's A100 it crosses PCIe; here, without a profile, it is a "
         "memcpy inside one process, while recompute runs the model on the CPU")

CLAIMS: list[Claim] = [
    Claim("fig2_recompute_flat", "Fig. 2", "block size has minimal effect on its overhead",
          "recompute: " + _ENGINE + ", its spread across block sizes ((max - min) / mean)",
          Test("below", 0.25), flat_over_block_size("recompute"),
          why="minimal taken as a spread under 25% of the mean"),
    Claim("fig2_swap_falls", "Fig. 2", "the overhead decreases with increasing block size",
          "swap-host: slope of " + _ENGINE + " over log2(block size)", Test("below", 0.0),
          trend("fig2", "swap-host", log2x=True, what="by block size"),
          profiles=POSTER_PLATFORM, why=_COPY),
    Claim("fig2_pinned", "Fig. 2", "more efficient for large block sizes with pinned memory",
          "swap with and without pinned memory", Test("below", 0.0), pinned, profiles=POSTER_PLATFORM,
          why="pinned (page-locked) memory speeds up GPU-host DMA; no profile here models pinned memory"),
    Claim("fig3_tokens_recompute", "Fig. 3",
          "The overhead increases with increasing the number of recomputed/swapped tokens",
          "recompute: slope of " + _ENGINE + " over evicted tokens (per 1000), across Fig. 5's shares",
          Test("above", 0.0), trend("fig5", "recompute", x_key="evicted_tokens", per=1000.0, what="by evicted tokens")),
    Claim("fig3_tokens_swap", "Fig. 3",
          "The overhead increases with increasing the number of recomputed/swapped tokens",
          "swap-host: slope of " + _ENGINE + " over evicted tokens (per 1000), across Fig. 5's shares",
          Test("above", 0.0), trend("fig5", "swap-host", x_key="evicted_tokens", per=1000.0, what="by evicted tokens")),
    Claim("fig3_swap_lower", "Fig. 3", "Swap has lower overhead when more tokens are evicted in an overflow",
          "recompute's minus swap-host's " + _ENGINE + " at the smallest share (the most evictions)",
          Test("above", 0.0), recompute_minus_swap("fig5", "smallest"), profiles=POSTER_PLATFORM, why=_COPY),
    Claim("fig4_length_recompute", "Fig. 4", "The overhead increases with increasing the sequence length",
          "recompute: slope of " + _ENGINE + " over input + output tokens (per 100)", Test("above", 0.0),
          trend("fig4", "recompute", per=100.0, what="by sequence length"), seed="batch size 16"),
    Claim("fig4_length_swap", "Fig. 4", "The overhead increases with increasing the sequence length",
          "swap-host: slope of " + _ENGINE + " over input + output tokens (per 100)", Test("above", 0.0),
          trend("fig4", "swap-host", per=100.0, what="by sequence length"), seed="batch size 16"),
    Claim("fig4_swap_better_long", "Fig. 4", "Swap performs better than recompute for long sequences (lower overhead)",
          "recompute's minus swap-host's " + _ENGINE + " at the longest sequences", Test("above", 0.0),
          recompute_minus_swap("fig4", "longest"), profiles=POSTER_PLATFORM, why=_COPY),
    Claim("fig5_falls_recompute", "Fig. 5", "Overhead decreases with increasing the avail. GPU Mem.",
          "recompute: slope of " + _ENGINE + " over the share of memory available, shares <= 40%",
          Test("below", 0.0), trend("fig5", "recompute", keep=lambda x: x <= 0.4 + 1e-9, what="by share"),
          seed="<= 40%; input 1500, output 1024, 32 requests at once"),
    Claim("fig5_falls_swap", "Fig. 5", "Overhead decreases with increasing the avail. GPU Mem.",
          "swap-host: slope of " + _ENGINE + " over the share of memory available, shares <= 40%",
          Test("below", 0.0), trend("fig5", "swap-host", keep=lambda x: x <= 0.4 + 1e-9, what="by share"),
          seed="<= 40%; input 1500, output 1024, 32 requests at once"),
    Claim("fig5_lowest", "Fig. 5", "Recompute/Swap get the lowest overhead when avail. GPU Mem. is 30% or 50%",
          "distance of the share with the lowest " + _ENGINE + " from 30% or 50% (the worse of the two strategies)",
          Test("below", 0.05), lowest_share, seed="30% or 50%"),
    Claim("fig6_recompute_drop", "Fig. 6", "GPU usage decreases when eviction happens",
          "recompute: " + _DROP, Test("below", 0.0),
          fig6("recompute", "usage_per_preemption", "usage per preemption"),
          seed="avail. GPU Mem. 12%"),
    Claim("fig6_recompute_rise", "Fig. 6", "increases when evicted requests are resumed",
          "recompute: " + _RISE, Test("above", 0.0),
          fig6("recompute", "usage_per_admission", "usage per admission"),
          seed="avail. GPU Mem. 12%"),
    Claim("fig6_recompute_periodic", "Fig. 6", "Throughput increases periodically over time",
          "recompute: " + _PERIODIC, Test("above", 0.0), fig6("recompute", "extra_rises", "extra rises"),
          seed="avail. GPU Mem. 12%"),
    Claim("fig6_recompute_cause", "Fig. 6", "due to the processing of waiting and resumed requests",
          "recompute: " + _CAUSE, Test("above", 0.5), fig6("recompute", "rises_with_admissions", "share"),
          seed="avail. GPU Mem. 12%", why="most rises (over half) taken as the cause"),
    Claim("fig6_swap_drop", "Fig. 6", "GPU usage decreases when eviction happens",
          "swap-host: " + _DROP, Test("below", 0.0),
          fig6("swap-host", "usage_per_preemption", "usage per preemption"),
          seed="avail. GPU Mem. 12%"),
    Claim("fig6_swap_rise", "Fig. 6", "increases when evicted requests are resumed",
          "swap-host: " + _RISE, Test("above", 0.0),
          fig6("swap-host", "usage_per_admission", "usage per admission"),
          seed="avail. GPU Mem. 12%"),
    Claim("fig6_swap_periodic", "Fig. 6", "The periodically sharp increase of throughput",
          "swap-host: " + _PERIODIC, Test("above", 0.0), fig6("swap-host", "extra_rises", "extra rises"),
          seed="avail. GPU Mem. 12%"),
    Claim("fig6_swap_cause", "Fig. 6", "is caused by the processing of waiting requests (prompt phase)",
          "swap-host: " + _CAUSE, Test("above", 0.5), fig6("swap-host", "rises_with_admissions", "share"),
          seed="avail. GPU Mem. 12%", why="most rises (over half) taken as the cause"),
]
