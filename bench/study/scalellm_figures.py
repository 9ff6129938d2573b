"""ScaleLLM's per-level figures from the requests' records (pure: records in, figures out).

A request is a `RequestRecord` as its client saw it (HTTP or gRPC), with the engine's time from the
frontend's turn summary when it was found. `level_figures` makes one repeat's Table 1, Fig. 6 and
Fig. 7 figures of a level; `pool` sets a level's repeats side by side: the pooled figures (every
repeat's records over their summed wall time, for the tables and plots) with each repeat's own
figures under `repeats` (what the claims judge, one value per repeat).
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.stats import mean, percentile, ratio


@dataclasses.dataclass
class RequestRecord:
    """One request as its client saw it; engine figures from the frontend's turn summary when found."""

    client: int
    status: str                     # "ok", "timeout" or "error"
    e2e_s: float                    # from sending to the end of the stream (or to giving up at the timeout)
    ttft_s: float | None = None     # first text (a timed-out request's too, if it came)
    tokens: int = 0                 # completion tokens (usage), ok requests only
    prompt_tokens: int = 0
    error: str = ""
    user: str = ""
    session_id: str = ""
    engine_ms: float | None = None          # the compute node's time (summary.engine_ms)
    frontend_e2e_ms: float | None = None    # the frontend's e2e (summary.e2e_ms)
    gateway_ms: float | None = None         # summary.gateway_ms: frontend e2e - engine
    replica: str = ""                       # summary.replica: the replica the frontend routed it to


def tbt_s(record: RequestRecord) -> float | None:
    """ScaleLLM's TBT of one request: its average wait per token after the first; None under 2 tokens."""
    if record.status != "ok" or record.tokens < 2 or record.ttft_s is None:
        return None
    return (record.e2e_s - record.ttft_s) / (record.tokens - 1)


def in_virtual_time(records: Sequence[RequestRecord], wall_s: float,
                    dilation: float) -> tuple[list[RequestRecord], float]:
    """Under a hardware profile: the records and the level's wall time in virtual time (every time / D).
    The clients' clocks and the services' (the turn summaries' ms) are wall clocks of a run dilated D x."""
    if dilation == 1.0:
        return list(records), wall_s

    def v(x):
        return None if x is None else x / dilation
    return ([dataclasses.replace(r, e2e_s=r.e2e_s / dilation, ttft_s=v(r.ttft_s), engine_ms=v(r.engine_ms),
                                 frontend_e2e_ms=v(r.frontend_e2e_ms), gateway_ms=v(r.gateway_ms))
             for r in records], wall_s / dilation)


def classify(record: RequestRecord, timeout_s: float) -> str:
    """ok, timeout or error; a request that ended after the timeout is a timeout even if it completed."""
    if record.status == "ok" and record.e2e_s > timeout_s:
        return "timeout"
    return record.status


def _p(values: Sequence[float]) -> dict[str, float] | None:
    """{n, mean, p50, p99, max} in ms of values in seconds; None without values."""
    if not values:
        return None
    ms = [v * 1e3 for v in values]
    return {"n": len(ms), "mean": mean(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99),
            "max": max(ms)}


def level_figures(records: Sequence[RequestRecord], wall_s: float, timeout_s: float) -> dict[str, Any]:
    """One level's Table 1, Fig. 6 and Fig. 7 figures from its requests' records.

    Latencies are over the completed requests; timeouts and errors are counted beside them.
    Throughput is the completed requests' tokens over the level's wall time (ScaleLLM's N_t /
    (T1 - T0)). Engine and gateway means are over the completed requests whose summary was found
    (`summaries` says how many)."""
    if wall_s <= 0:
        raise ValueError(f"a level's wall time must be positive, not {wall_s}")
    kinds = [classify(r, timeout_s) for r in records]
    status = collections.Counter(kinds)
    ok = [r for r, k in zip(records, kinds) if k == "ok"]
    tbts = [t for t in map(tbt_s, ok) if t is not None]
    tokens = sum(r.tokens for r in ok)
    with_engine = [r for r in ok if r.engine_ms is not None]
    engine = mean([r.engine_ms for r in with_engine]) if with_engine else None
    gateway = mean([r.gateway_ms for r in with_engine]) if with_engine else None
    client_e2e = mean([r.e2e_s * 1e3 for r in with_engine]) if with_engine else None
    frontend_e2e = mean([r.frontend_e2e_ms for r in with_engine]) if with_engine else None
    errors = [r.error for r, k in zip(records, kinds) if k == "error"]
    timed_out = [r for r, k in zip(records, kinds) if k == "timeout"]
    return {
        "requests": len(records), "completed": len(ok),
        "timeouts": status["timeout"], "errors": status["error"],
        "timeout_share": ratio(status["timeout"], len(records)) if records else 0.0,
        "error_examples": sorted(set(errors))[:3],
        "wall_s": wall_s,
        "ttft_ms": _p([r.ttft_s for r in ok if r.ttft_s is not None]),
        # every request but the errors, a timed-out one without its first text counted at its timeout
        # (a lower bound): TTFT as the waiting users saw it
        "ttft_ms_incl_timeouts": _p([r.ttft_s if r.ttft_s is not None else r.e2e_s
                                     for r, k in zip(records, kinds) if k != "error"]),
        "timeouts_with_first_text": sum(1 for r in timed_out if r.ttft_s is not None and r.ttft_s <= timeout_s),
        "tbt_ms": _p(tbts),
        "e2e_ms": _p([r.e2e_s for r in ok]),
        "output_tokens": tokens, "output_tokens_per_s": tokens / wall_s,
        "prompt_tokens_mean": mean([r.prompt_tokens for r in ok]) if ok else None,
        "summaries": len(with_engine),
        # completed requests by the replica that served them (their summaries'): how routing spread them
        "by_replica": dict(sorted(collections.Counter(r.replica for r in with_engine if r.replica).items())),
        "engine_ms_mean": engine,
        "gateway_ms_mean": gateway,                      # frontend e2e - engine (the turn summary's split)
        "client_gateway_ms_mean": None if engine is None else client_e2e - engine,  # client e2e - engine
        "client_side_ms_mean": None if frontend_e2e is None else client_e2e - frontend_e2e,
        "gateway_share": None if engine is None else ratio(gateway, gateway + engine),
        "client_gateway_share": None if engine is None else ratio(client_e2e - engine, client_e2e),
    }


def with_counters(figures: dict, generated: int | None, preemptions: dict | None,
                  cpu_cores: dict | None) -> dict:
    """A repeat's figures with the compute nodes' counters over it: every token they generated
    (timed-out requests' too: ScaleLLM's N_t), their preemptions, the cores each process kept busy."""
    figures["generated_tokens"] = generated
    figures["generated_tokens_per_s"] = None if generated is None else generated / figures["wall_s"]
    figures["preemptions"] = preemptions
    figures["cpu_cores"] = cpu_cores
    return figures


def pool(runs: Sequence[tuple[dict, Sequence[RequestRecord]] | str], timeout_s: float) -> dict:
    """A level's repeats ((figures, records) each, or the error of one that failed) as one: the figures of
    every repeat's records over their summed wall time, the counters summed, and each repeat's own figures
    under `repeats` ({"failed": error} at a failed one's index, so that repeats pair by index)."""
    repeats = [r for r in runs if not isinstance(r, str)]
    if not repeats:
        raise ValueError("pool: no repeat ran")
    records = [r for _, rs in repeats for r in rs]
    figures = level_figures(records, sum(f["wall_s"] for f, _ in repeats), timeout_s)
    generated = [f.get("generated_tokens") for f, _ in repeats]
    preemptions: collections.Counter = collections.Counter()
    for f, _ in repeats:
        preemptions.update(f.get("preemptions") or {})
    cores = [f["cpu_cores"] for f, _ in repeats if f.get("cpu_cores")]
    with_counters(figures, None if None in generated else sum(generated),
                  dict(preemptions) if any(f.get("preemptions") is not None for f, _ in repeats) else None,
                  {k: mean([c.get(k, 0.0) for c in cores]) for k in cores[0]} if cores else None)
    figures["repeats"] = [{"failed": r} if isinstance(r, str) else r[0] for r in runs]
    return figures


def measured_levels(levels: Mapping[str, dict]) -> dict[int, dict]:
    """The levels that ran, by concurrency (failed ones left to `failed`)."""
    return {int(c): f for c, f in levels.items() if "failed" not in f}


def repeats_of(levels: Mapping[int, dict]) -> list[dict[int, dict]]:
    """Each repeat's levels: [{c: that repeat's figures}], a level without a repeat of that index (or
    without `repeats`, as one repeat) left out of it."""
    n = max((len(f.get("repeats") or [f]) for f in levels.values()), default=0)
    out = []
    for r in range(n):
        out.append({c: (f.get("repeats") or [f])[r] for c, f in levels.items()
                    if r < len(f.get("repeats") or [f]) and "failed" not in (f.get("repeats") or [f])[r]})
    return out


def per_repeat(levels: Mapping[int, dict], fn: Callable[[dict[int, dict]], float | None]) -> list[float]:
    """fn over each repeat's levels (repeats_of), the Nones (a figure the repeat lacks) left out."""
    values = []
    for one in repeats_of(levels):
        try:
            v = fn(one)
        except (KeyError, TypeError, ZeroDivisionError):
            v = None
        if v is not None:
            values.append(float(v))
    return values


def stat(f: dict, key: str, which: str = "p50") -> float | None:
    """A level's figure: a percentile dict's `which`, or the plain value."""
    value = f.get(key)
    return value.get(which) if isinstance(value, dict) else value


def ttft_of(f: dict) -> dict | None:
    """A level's TTFT as its users saw it: timed-out requests included (ttft_ms over the completed ones
    where that figure is absent)."""
    return f.get("ttft_ms_incl_timeouts", f.get("ttft_ms"))


def throughput(f: dict) -> tuple[float, str]:
    """A level's throughput for Fig. 7: every token the compute node generated over the wall time when
    its counters answered (ScaleLLM's N_t / (T1 - T0)), else the completed requests' tokens."""
    if f.get("generated_tokens_per_s") is not None:
        return f["generated_tokens_per_s"], "generated"
    return f["output_tokens_per_s"], "completed"


def ratios(levels: Mapping[int, dict]) -> dict[str, float]:
    """Every level against one client, measured in the same run (pooled figures)."""
    r: dict[str, float] = {}
    for c, f in sorted(levels.items()):
        r[f"timeouts_{c}"] = f["timeouts"]
        if f.get("gateway_share") is not None:
            r[f"gateway_share_{c}"] = f["gateway_share"]
    if 1 not in levels:
        return r
    base = levels[1]
    for c, f in sorted(levels.items()):
        if c == 1:
            continue
        r[f"tokens_per_s_{c}_vs_1"] = ratio(throughput(f)[0], throughput(base)[0])
        r[f"completed_tokens_per_s_{c}_vs_1"] = ratio(f["output_tokens_per_s"], base["output_tokens_per_s"])
        for name, of in (("ttft", ttft_of), ("tbt", lambda level: level["tbt_ms"])):
            a, b = of(f), of(base)
            for which in ("p50", "p99"):
                if a and b and b[which]:
                    r[f"{name}_{which}_{c}_vs_1"] = a[which] / b[which]
        if f.get("engine_ms_mean") and base.get("engine_ms_mean"):
            r[f"engine_ms_{c}_vs_1"] = f["engine_ms_mean"] / base["engine_ms_mean"]
    return r
