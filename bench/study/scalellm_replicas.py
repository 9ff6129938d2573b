"""`kvtb study scalellm --replicas 1 2`: ScaleLLM's Fig. 8 question, replica parallelism against one
replica, from the levels each replica count measured (pure: figures in, ratios, claims and a table out).

ScaleLLM (§5, Exp4, Fig. 8) splits the same 8 GPUs into one replica with tensor parallelism 8, two
with 4 or four with 2: at low concurrency the one replica with all the compute is fastest, at high
concurrency replica parallelism wins (two replicas a modest improvement over one). Here the same
cores are one compute node with all of them or, with `kvtb up --replicas 2`, two compute nodes with
a share each, behind one frontend that routes by load. Each count's levels are in
`results.by_replicas[N].levels`, shaped as the single-replica study's (bench.study.scalellm), and
every ratio is N replicas over the smallest count measured, at the same level of the same run.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.results import plot_lines
from bench.stats import ratio
from bench.study.report import claim, unmeasured

FIGURE = "Fig. 8"


def _throughput(f: dict) -> float:
    """A level's tokens/s: what the compute nodes generated when their counters answered, else the
    completed requests' (bench.study.scalellm.throughput)."""
    generated = f.get("generated_tokens_per_s")
    return generated if generated is not None else f["output_tokens_per_s"]


def same_kind(mine: dict, theirs: dict) -> tuple[float, float]:
    """Two levels' tokens/s of one kind: generated when both counted it, else the completed requests'."""
    key = ("generated_tokens_per_s" if mine.get("generated_tokens_per_s") is not None
           and theirs.get("generated_tokens_per_s") is not None else "output_tokens_per_s")
    return mine[key], theirs[key]


def throughput_ratio(mine: dict, theirs: dict) -> float:
    """mine's tokens/s over theirs, both of one kind (same_kind)."""
    return ratio(*same_kind(mine, theirs))


def _stat(f: dict, key: str, stat: str = "p50") -> float | None:
    value = f.get(key)
    return value.get(stat) if isinstance(value, dict) else None


def _ttft(f: dict, stat: str = "p50") -> float | None:
    """TTFT as the users saw it (timed-out requests included when the level has that figure)."""
    return _stat(f, "ttft_ms_incl_timeouts" if f.get("ttft_ms_incl_timeouts") else "ttft_ms", stat)


def counts_levels(study: dict) -> dict[int, dict[int, dict]]:
    """replica count -> concurrency -> a level's figures, the levels that ran (failed ones left out)."""
    by = study["results"].get("by_replicas") or {}
    return {int(n): {int(c): f for c, f in (entry.get("levels") or {}).items() if "failed" not in f}
            for n, entry in by.items()}


def add_replica_ratios(study: dict) -> None:
    """At each level both counts measured: tokens/s, TTFT and e2e p50 of N replicas over the base count
    (the smallest), `<figure>_<N>r_vs_<base>r_at_<c>`."""
    counts = counts_levels(study)
    if len(counts) < 2:
        return
    base = min(counts)
    r = study["ratios"]
    for n in sorted(counts)[1:]:
        for c in sorted(set(counts[n]) & set(counts[base])):
            mine, theirs = counts[n][c], counts[base][c]
            tag = f"{n}r_vs_{base}r_at_{c}"
            r[f"tokens_per_s_{tag}"] = throughput_ratio(mine, theirs)
            for name, a, b in (("ttft_p50", _ttft(mine), _ttft(theirs)),
                               ("e2e_p50", _stat(mine, "e2e_ms"), _stat(theirs, "e2e_ms"))):
                if a is not None and b:
                    r[f"{name}_{tag}"] = a / b


def _x(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def add_replica_claims(study: dict) -> None:
    """Fig. 8's two claims beside this run: at the lowest level the one replica with every core is
    faster; at the highest, two replicas are. A claim whose counts or levels did not run says why."""
    counts = counts_levels(study)
    settings = study["settings"]
    asked = sorted(settings.get("replicas") or [])
    if len(asked) < 2:
        return
    cores = study["machine"].get("cores")
    why_scale = (f"ScaleLLM split 8 H100 GPUs among the replicas (TP8, 2 x TP4, 4 x TP2); here "
                 f"{cores} CPU cores are split by `kvtb up` among the compute nodes, and shared with the "
                 "frontend, the agents, the storage node and the clients, so the question is answered at "
                 "this machine's scale")
    base, top_n = asked[0], asked[-1]
    common = sorted(set(counts.get(base, {})) & set(counts.get(top_n, {})))
    low_text = (f"At low concurrency one replica with all the compute outperforms {top_n} replicas "
                f"sharing it (Fig. 8a, TP8 against replicas with less tensor parallelism each)")
    high_text = (f"At high concurrency {top_n} replicas outperform one with the same compute "
                 "(Fig. 8b; two TP4 replicas a modest improvement over one TP8, four TP2 clearly ahead)")
    if not common:
        missing = next((unmeasured(study, f["part"]) for f in study["failed"]), "not measured: no level ran "
                       "under both replica counts")
        claim(study, FIGURE, low_text, missing, None, why_scale)
        claim(study, FIGURE, high_text, missing, None, why_scale)
        return
    tps = {c: throughput_ratio(counts[top_n][c], counts[base][c]) for c in common}
    ttft = {c: (_ttft(counts[top_n][c]) or math.nan) / (_ttft(counts[base][c]) or math.nan) for c in common}
    crossover = next((c for c in common if tps[c] > 1.0), None)
    per_level = ", ".join(f"{c}: {_x(tps[c])}" for c in common)
    low, high = common[0], common[-1]

    def at(c: int) -> str:
        a, b = counts[base][c], counts[top_n][c]
        mine, theirs = same_kind(b, a)
        return (f"{mine:.1f} against {theirs:.1f} tokens/s ({_x(tps[c])}), TTFT p50 "
                f"{_x(ttft[c])}, timeouts {b['timeouts']} against {a['timeouts']}")

    claim(study, FIGURE, low_text,
          f"at {low} concurrent, {top_n} replicas over {base}: {at(low)}; "
          f"tokens/s ratio by level {per_level}",
          tps[low] < 1.0,
          (f"at {low} concurrent the load fits one engine: {top_n} replicas leave a compute node's share of "
           f"the cores idle while the one replica's forward uses every core (its torch threads), as TP8 "
           f"uses every GPU; " if tps[low] < 1.0 else
           f"at {low} concurrent the one replica was not faster: a small batch's CPU forward gains little "
           f"from a second thread when the other services keep that core busy too, so a compute node on one "
           f"core loses little; ") + why_scale)
    if high == low:
        claim(study, FIGURE, high_text, f"only one level ({low}) ran under both counts", None, why_scale)
        return
    claim(study, FIGURE, high_text,
          f"at {high} concurrent, {top_n} replicas over {base}: {at(high)}; "
          + (f"replicas first ahead at {crossover} concurrent" if crossover else "never ahead at any level"),
          tps[high] > 1.0,
          ("each compute node batches and schedules on its own, so two engines on one core each overlap "
           "what one engine on two cores does in turn (its Python step, sampling, the scheduler), and each "
           "batch is half as big; " if tps[high] > 1.0 else
           "a batched CPU forward already keeps both cores busy, so splitting them buys no parallelism, and "
           "each engine's step then runs on one core beside a share of the frontend's, the agents' and the "
           "clients' work; ") + why_scale)


def served_by(f: dict | None) -> str:
    """'replica-0 9, replica-1 7': a level's completed requests by the replica that served them."""
    spread = (f or {}).get("by_replica") or {}
    return ", ".join(f"{name} {n}" for name, n in sorted(spread.items())) or "-"


def replica_table(study: dict) -> str:
    """One row per level: each count's tokens/s, TTFT p50 and e2e p50 side by side, and their ratios."""
    counts = counts_levels(study)
    if not counts:
        return ""
    ns = sorted(counts)
    base = ns[0]
    levels = sorted({c for n in ns for c in counts[n]})
    head = ["concurrent"]
    for label in ("tokens/s", "TTFT p50 ms", "e2e p50 ms", "timeouts"):
        head += [f"{label}, {n} replica{'s' if n > 1 else ''}" for n in ns]
    head += [f"{name} {n}r/{base}r" for n in ns[1:] for name in ("tokens/s", "TTFT", "e2e")]
    head += [f"served by, {n} replicas" for n in ns if n > 1]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    r = study["ratios"]

    def cell(n: int, c: int, of) -> str:
        f = counts[n].get(c)
        value = None if f is None else of(f)
        if value is None or isinstance(value, int):
            return "-" if value is None else str(value)
        return f"{value:.0f}" if value >= 100 else f"{value:.1f}"

    for c in levels:
        cells = [str(c)]
        for of in (_throughput, _ttft, lambda f: _stat(f, "e2e_ms"), lambda f: f["timeouts"]):
            cells += [cell(n, c, of) for n in ns]
        for n in ns[1:]:
            tag = f"{n}r_vs_{base}r_at_{c}"
            cells += [_x(r[k]) if k in r else "-" for k in (f"tokens_per_s_{tag}", f"ttft_p50_{tag}",
                                                             f"e2e_p50_{tag}")]
        cells += [served_by(counts[n].get(c)) for n in ns if n > 1]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def placements_text(study: dict) -> str:
    """Each count's compute nodes' CPUs and torch threads, as its stack announced them."""
    by = study["results"].get("by_replicas") or {}
    parts = []
    for n, entry in sorted(by.items(), key=lambda kv: int(kv[0])):
        placement = entry.get("placement")
        if not placement:
            continue
        cpus = ", ".join(f"{name} on CPUs {c}" for name, c in sorted(placement["cpus"].items())
                         if name.startswith("compute"))
        threads = ", ".join(f"{r}: {t}" for r, t in sorted(placement["torch_threads"].items()))
        parts.append(f"{n} replica{'s' if int(n) > 1 else ''}: {cpus} (torch threads {threads})")
    return ("Compute nodes: " + "; ".join(parts) + ".") if parts else ""


def replicas_text(settings: Mapping[str, Any], cores: Any) -> str:
    """The intro's paragraph on the replica counts: what each stack is, the routing, the CPU caveat."""
    counts = settings.get("replicas") or [1]
    if counts == [1]:
        return ""
    return (f" Replica counts {', '.join(map(str, counts))} (ScaleLLM's Fig. 8 question): for each, a stack "
            f"of that many agent and compute node pairs (`kvtb up --replicas N`) sharing the storage node "
            f"behind one frontend that routes each request `{settings.get('routing')}` (every request opens "
            f"a conversation of its own, sharing with its client's earlier ones at most the short system "
            f"prompt, so a replica's affinity for a prefix, kv_aware's, has little to keep: routing by load "
            f"asks Fig. 8's question directly), the same levels run through it. Caveat: this machine has "
            f"{cores} cores, and "
            f"`kvtb up` gives each compute node its own share of them, so with 2 replicas each compute node "
            f"runs on one core where the single replica had both, and all of them share the cores with the "
            f"frontend, the agents, the storage node and the clients: as ScaleLLM's replicas split the same "
            f"GPUs, the comparison holds the compute fixed, and the question is answered at this machine's "
            f"scale, not a GPU cluster's.")


def draw_replicas(study: dict, out: Path) -> list[Path | None]:
    """Fig. 8's shape: throughput, and TTFT p50, against concurrency, one line per replica count."""
    counts = counts_levels(study)
    if len(counts) < 2:
        return []

    def series(of) -> dict[str, tuple[list[int], list[float]]]:
        out_ = {}
        for n, levels in sorted(counts.items()):
            pts = [(c, of(f)) for c, f in sorted(levels.items()) if of(f) is not None]
            out_[f"{n} replica{'s' if n > 1 else ''}"] = ([c for c, _ in pts], [v for _, v in pts])
        return out_

    fig8 = plot_lines(out / "scalellm-fig8-replicas-throughput.png", series(_throughput),
                      title="Fig. 8: throughput against concurrency by replica count",
                      xlabel="concurrent requests",
                      ylabel="output tokens/s", logx=True)
    ttft = plot_lines(out / "scalellm-fig8-replicas-ttft.png", series(_ttft),
                      title="TTFT p50 against concurrency by replica count", xlabel="concurrent requests",
                      ylabel="ms", logx=True, logy=True)
    return [fig8, ttft]
