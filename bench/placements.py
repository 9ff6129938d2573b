"""Both CPU placements side by side in one run (`--placements shared nic`, kvtb.placement).

`add_placements_arg` gives a benchmark `--placements` (default: `shared nic` where this process
may use 2 CPUs or more, else `shared`: `nic` needs a CPU for the compute node and one for the
NIC). `run_placements` runs a benchmark's measurement once per placement, each into a result of
its own (`sub_result`: the benchmark's existing code fills and reads it unchanged), and puts them
together in the benchmark's result:

- `results`: the first placement's figures under their usual keys (what the headline tables and
  older readers read), and `results["by_placement"] = {placement: {placement, results, ratios,
  floors, failed, key_figures}}`, every placement measured (the first included);
- `ratios`: the first placement's ratios under their usual keys, every placement's as
  `<ratio>@<placement>`, and each key figure compared as `<figure>@nic_vs_shared` (nic / shared);
- `floors`: the first placement's, and every placement's as `<ratio>@<placement>`;
- `failed`: every placement's failed parts, each named `<placement>: <part>`, and a placement that
  raised (its stack did not start, say) as part `<placement>` (its `error` in by_placement too);
- `machine["placement"]`: a list, one record per placement (name, each service's CPUs, the compute
  node's torch threads; `started: false` where its services never came up).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bench import results as bench_results
from bench.results import fail, format_table
from bench.stats import ratio
from kvtb import placement

PLACEMENTS = placement.PLACEMENTS
BASE, OTHER = "shared", "nic"  # the comparison: OTHER / BASE


def default_placements(cpus: Iterable[int] | None = None) -> list[str]:
    """`shared nic` on 2 CPUs or more (this process's set, as kvtb.placement.plan places them), else
    `shared` (nic cannot be placed on 1 CPU)."""
    cpus = tuple(placement.current_cpus() if cpus is None else cpus)
    return ["shared", "nic"] if len(cpus) >= 2 else ["shared"]


def add_placements_arg(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, metavar="PLACEMENT",
                        help="CPU placements to run side by side, one stack each (shared, nic; default: "
                             f"{' '.join(default_placements())} on this machine: both on 2 CPUs or more)")
    return parser


def chosen(values: Sequence[str] | None) -> list[str]:
    """The placements asked for, each once, in order; default_placements() when none."""
    return list(dict.fromkeys(values)) if values else default_placements()


def sub_result(result: dict[str, Any]) -> dict[str, Any]:
    """A result of the benchmark's own shape for one placement: bench, machine and settings shared
    with `result`, results, ratios and failed its own."""
    own = ("results", "ratios", "failed", "floors", "plots")
    return {**{k: v for k, v in result.items() if k not in own}, "results": {}, "ratios": {}, "failed": []}


def planned_record(name: str) -> dict[str, Any]:
    """The record of a placement whose services never came up: its plan's CPUs (none where it has no
    plan here, e.g. nic on 1 CPU)."""
    try:
        cpus = placement.formatted(placement.plan(name))
    except ValueError:
        cpus = {}
    return {"name": name, "cpus": cpus, "torch_threads": None, "started": False}


def run_placements(result: dict[str, Any], placements: Sequence[str],
                   measure: Callable[[str, dict[str, Any]], dict[str, Any] | None],
                   key_figures: Callable[[dict[str, Any]], dict[str, float]] = lambda sub: {}
                   ) -> dict[str, dict]:
    """measure(placement, sub) for each placement, into sub_result(result); it may return the
    placement's record (a run without a Stack), else the Stack's (bench.results.placement_info) is
    taken. A placement that raises is recorded failed (part = its name) and the next one runs.
    key_figures(sub) -> {figure: value}: compared as `<figure>@nic_vs_shared` where both have it.
    Returns {placement: sub}."""
    subs: dict[str, dict] = {}
    records = []
    by = result["results"].setdefault("by_placement", {})
    for name in placements:
        sub = sub_result(result)
        bench_results.forget_placement()
        record, error = None, None
        try:
            record = measure(name, sub)
        except Exception as exc:  # noqa: BLE001 - a placement that fails is reported, never dropped
            error = fail(result, name, exc)["error"]
        if record is None:
            info = bench_results.recorded_placement()
            record = {**info, "started": True} if info and info["name"] == name else planned_record(name)
        records.append(record)
        subs[name] = sub
        figures = key_figures(sub) if sub["results"] else {}
        by[name] = {"placement": record, "results": sub["results"], "ratios": sub["ratios"],
                    "floors": sub.get("floors", {}), "failed": sub["failed"], "key_figures": figures,
                    **({"error": error} if error else {})}
        result["failed"] += [{"part": f"{name}: {f['part']}", "error": f["error"]} for f in sub["failed"]]
        result["ratios"] |= {f"{k}@{name}": v for k, v in sub["ratios"].items()}
        result.setdefault("floors", {})
        result["floors"] |= {f"{k}@{name}": v for k, v in sub.get("floors", {}).items()}
    first = subs[placements[0]]
    result["results"] |= {k: v for k, v in first["results"].items() if k != "by_placement"}
    result["ratios"] |= first["ratios"]
    result["floors"] |= first.get("floors", {})
    if BASE in by and OTHER in by:
        base, other = by[BASE]["key_figures"], by[OTHER]["key_figures"]
        result["ratios"] |= {f"{k}@{OTHER}_vs_{BASE}": ratio(other[k], base[k]) for k in base if k in other}
    if isinstance(result.get("machine"), dict):
        result["machine"]["placement"] = records
    return subs


def placement_line(entry: dict[str, Any]) -> str:
    """'placement nic: compute 0, smartnic 1, storage 1, frontend 1; torch threads 1'."""
    record = entry["placement"]
    cpus = ", ".join(f"{service} {c or 'all'}" for service, c in sorted(record.get("cpus", {}).items()))
    threads = f"; torch threads {record['torch_threads']}" if record.get("torch_threads") else ""
    return f"placement {record['name']}: {cpus or 'not started'}{threads}"


def tables(result: dict[str, Any], table: Callable[[dict[str, Any]], str]) -> str:
    """Each placement's table (the benchmark's own, from its sub-result) under a line naming its CPUs,
    then the key figures side by side with nic / shared."""
    by = result["results"].get("by_placement") or {}
    parts = []
    for name, entry in by.items():
        sub = {**sub_result(result), "results": entry["results"], "ratios": entry["ratios"],
               "floors": entry["floors"], "failed": entry["failed"]}
        try:
            body = table(sub) if entry["results"] else ""
        except (KeyError, TypeError, ValueError) as exc:  # a placement that stopped half-way
            body = f"(its figures are incomplete: {type(exc).__name__}: {exc})"
        if entry.get("error"):
            body += ("\n" if body else "") + f"FAILED {name}: {entry['error'][:300]}"
        parts.append(f"== {placement_line(entry)}\n{body}")
    parts.append(comparison(result))
    return "\n\n".join(p for p in parts if p)


def comparison(result: dict[str, Any]) -> str:
    """The key figures of every placement side by side, with nic / shared ('' with one placement)."""
    by = result["results"].get("by_placement") or {}
    if len(by) < 2:
        return ""
    names = list(by)
    keys = list(dict.fromkeys(k for entry in by.values() for k in entry["key_figures"]))
    both = BASE in by and OTHER in by
    rows = []
    for key in keys:
        values = [by[n]["key_figures"].get(key) for n in names]
        row = [key, *(f"{v:.4g}" if isinstance(v, (int, float)) else "-" for v in values)]
        if both:
            r = result["ratios"].get(f"{key}@{OTHER}_vs_{BASE}")
            row.append(f"{r:.3g}" if isinstance(r, (int, float)) else "-")
        rows.append(row)
    head = ["key figure", *names, *([f"{OTHER}/{BASE}"] if both else [])]
    return "placements side by side\n" + format_table(head, rows)
