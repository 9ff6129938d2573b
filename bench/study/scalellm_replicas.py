"""`kvtb study scalellm --replicas 1 2`: ScaleLLM's Fig. 8 question, replica parallelism against one
replica, from the levels each replica count measured (pure: figures in, ratios, claims and a table out).

ScaleLLM (§5, Exp4, Fig. 8) splits the same 8 GPUs into one replica with tensor parallelism 8, two
with 4 or four with 2: at low concurrency the one replica with all the compute is fastest, at high
concurrency replica parallelism wins (two replicas a modest improvement over one). Here the same
cores are one compute node with all of them or, with `kvtb up --replicas 2`, two compute nodes with
a share each, behind one frontend that routes by load. Each count's levels are in
`results.by_replicas[N].levels`, shaped as the single-replica study's (bench.study.scalellm), and
every ratio is N replicas over the smallest count measured, at the same level of the same run; the
claims pair the counts' repeats by index (the counts run one stack after the other).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.results import plot_lines
from bench.stats import ratio
from bench.study.claims import Claim, Evidence, Test

SEED = "scalellm-paper.txt"


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


# -- the claims (pure: from results.by_replicas, the settings beside them) ------------------------------

def _counts(results: Mapping[str, Any]) -> tuple[int, int, list[int], dict] | None:
    """(base count, top count, the levels both measured, counts_levels) or None with fewer than two."""
    asked = sorted((results.get("settings") or {}).get("replicas") or [])
    if len(asked) < 2:
        return None
    counts = counts_levels({"results": results})
    base, top = asked[0], asked[-1]
    common = sorted(set(counts.get(base, {})) & set(counts.get(top, {})))
    return base, top, common, counts


def _ratio_per_repeat(counts: dict, base: int, top: int, c: int) -> list[float]:
    """tokens/s of `top` replicas over `base` at level c, repeat by repeat (paired by index)."""
    mine, theirs = counts[top][c], counts[base][c]
    pairs = zip(mine.get("repeats") or [mine], theirs.get("repeats") or [theirs])
    return [throughput_ratio(a, b) for a, b in pairs if same_kind(a, b)[1]]


def _at(counts: dict, base: int, top: int, c: int) -> str:
    a, b = counts[base][c], counts[top][c]
    mine, theirs = same_kind(b, a)
    ttft = (_ttft(b) or math.nan) / (_ttft(a) or math.nan)
    return (f"at {c} concurrent, {top} replicas over {base} (pooled): {mine:.1f} against {theirs:.1f} tokens/s "
            f"({_x(ratio(mine, theirs))}), TTFT p50 {_x(ttft)}, timeouts {b['timeouts']} against {a['timeouts']}")


def low_evidence(results: Mapping[str, Any]) -> Evidence | None:
    got = _counts(results)
    if got is None or not got[2]:
        return None
    base, top, common, counts = got
    values = _ratio_per_repeat(counts, base, top, common[0])
    per_level = ", ".join(f"{c}: {_x(throughput_ratio(counts[top][c], counts[base][c]))}" for c in common)
    per = ", ".join(map(_x, values))
    return Evidence(values, f"tokens/s ratio per repeat {per}; {_at(counts, base, top, common[0])}; "
                            f"pooled ratio by level {per_level}")


def high_evidence(results: Mapping[str, Any]) -> Evidence | None:
    got = _counts(results)
    if got is None or not got[2]:
        return None
    base, top, common, counts = got
    if len(common) < 2:
        return Evidence([], f"only one level ({common[0]}) ran under both counts")
    values = _ratio_per_repeat(counts, base, top, common[-1])
    crossover = next((c for c in common if throughput_ratio(counts[top][c], counts[base][c]) > 1.0), None)
    per = ", ".join(map(_x, values))
    return Evidence(values, f"tokens/s ratio per repeat {per}; {_at(counts, base, top, common[-1])}; "
                            + (f"replicas first ahead (pooled) at {crossover} concurrent" if crossover
                               else "never ahead (pooled) at any level"))


WHY_SCALE = ("ScaleLLM split 8 H100 GPUs among the replicas (TP8, 2 x TP4, 4 x TP2); here this machine's CPU "
             "cores are split by `kvtb up` among the compute nodes, and shared with the frontend, the agents, the "
             "storage node and the clients, so the question is answered at this machine's scale")

CLAIMS: list[Claim] = [
    Claim("fig8a-one-replica-low", "Fig. 8a",
          "at lower concurrency levels, fully utilizing the available compute for tensor parallelism, without "
          "any replica parallelism demonstrates superior performance compared to configurations combining "
          "tensor and replica parallelism",
          "tokens/s of the most replicas over the fewest at the lowest level both ran, each repeat",
          Test("below", 1.0, unit="x"), low_evidence, seed="Fig. 8a (drawn, no numbers in the text)",
          why="one replica's forward uses every core (its torch threads) as TP8 uses every GPU; " + WHY_SCALE),
    Claim("fig8b-replicas-high", "Fig. 8b",
          "the trend shifts significantly at higher concurrency levels, favoring configurations with higher "
          "degrees of replica parallelism",
          "tokens/s of the most replicas over the fewest at the highest level both ran, each repeat",
          Test("above", 1.0, unit="x"), high_evidence, seed="Fig. 8b (drawn, no numbers in the text); "
          "two TP4 replicas a modest improvement over one TP8",
          why="each compute node batches and schedules on its own, so replicas overlap what one engine does in "
              "turn (its Python step, sampling, the scheduler); " + WHY_SCALE),
]


REPLICA_CLAIMS = CLAIMS   # judged beside bench.study.scalellm_claims.CLAIMS with two or more counts


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

    virtual = " (virtual time)" if study["settings"].get("profile") else ""
    fig8 = plot_lines(out / "scalellm-fig8-replicas-throughput.png", series(_throughput),
                      title="Fig. 8: throughput against concurrency by replica count",
                      xlabel="concurrent requests",
                      ylabel=f"output tokens/s{virtual}", logx=True)
    ttft = plot_lines(out / "scalellm-fig8-replicas-ttft.png", series(_ttft),
                      title="TTFT p50 against concurrency by replica count", xlabel="concurrent requests",
                      ylabel=f"TTFT p50, ms{virtual}", logx=True, logy=True)
    return [fig8, ttft]
