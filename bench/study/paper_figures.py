"""The transfer figures of `kvtb study paper` (Figs. 5-7), from its samples: pure, no I/O.

A sample is one transfer of one path at one size in one repetition: {mode, bytes, rep, blocks,
block_bytes, e2e_s, blocked_s, busy_s, agent_cpu_s}. The paths (`MODES`): `cpu` (CPU-centric, one
block's store at a time), `triggered` (the agent's standing PUTs) and `cpu-pipelined` (CPU-centric
with as many blocks' stores in flight as the triggered path keeps). A row per size holds each path's
medians and their ratios (for the tables and plots); the claims read the samples per repetition
(`by_rep`, `paired`), never the medians.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench import analytical_model as am
from bench import calibration
from bench.stats import median, ratio

MODES = ("cpu", "triggered", "cpu-pipelined")
PREFIX = {"cpu": "cpu", "triggered": "triggered", "cpu-pipelined": "pipelined"}  # a row's key prefix
METRICS = ("e2e_s", "blocked_s", "busy_s", "agent_cpu_s")
GB = 1e9


def by_rep(samples: Sequence[dict], size: int) -> dict[int, dict[str, dict]]:
    """{rep: {mode: sample}} of the measured repetitions (not the warm-ups) at one size."""
    out: dict[int, dict[str, dict]] = {}
    for s in samples:
        if s["bytes"] == size and s.get("rep", 0) >= 0:
            out.setdefault(s["rep"], {})[s["mode"]] = s
    return dict(sorted(out.items()))


def paired(samples: Sequence[dict], size: int, fn: Callable[[dict[str, dict]], float | None]) -> dict[int, float]:
    """fn over each repetition's samples at one size ({rep: value}), a repetition missing a path or giving
    None (a zero denominator) left out."""
    out = {}
    for rep, modes in by_rep(samples, size).items():
        try:
            value = fn(modes)
        except (KeyError, ZeroDivisionError):
            continue
        if value is not None:
            out[rep] = value
    return out


def e2e_ratio(num: str, den: str) -> Callable[[dict[str, dict]], float]:
    """A repetition's end-to-end time of path `num` over path `den` (a speedup of `den`)."""
    return lambda modes: modes[num]["e2e_s"] / modes[den]["e2e_s"]


def host_cpu_s(sample: dict) -> float:
    """The host's CPU seconds for a transfer: the compute process's and the agent's (the emulated NIC,
    which runs on this host's cores)."""
    return sample["busy_s"] + (sample.get("agent_cpu_s") or 0.0)


def sizes_of(samples: Sequence[dict]) -> list[int]:
    return sorted({s["bytes"] for s in samples})


def summarize(samples: Sequence[dict]) -> list[dict]:
    """Per size measured by the CPU-centric and the triggered path: each path's medians, speedup =
    CPU-centric / triggered end to end, the compute process's blocked and busy time and their ratios, the
    CPU seconds per GB moved, and with the pipelined path its speedups; `paired_speedups` per repetition."""
    by: dict[tuple[int, str], list[dict]] = {}
    for s in samples:
        if s.get("rep", 0) >= 0:
            by.setdefault((s["bytes"], s["mode"]), []).append(s)
    rows = []
    for size in sizes_of(samples):
        got = {m: by.get((size, m), []) for m in MODES}
        if not got["cpu"] or not got["triggered"]:
            continue
        first = got["cpu"][0]
        row: dict[str, Any] = {"bytes": size, "blocks": first["blocks"], "block_bytes": first["block_bytes"],
                               "n": min(len(got["cpu"]), len(got["triggered"]))}
        for mode, mine in got.items():
            if not mine:
                continue
            p = PREFIX[mode]
            for key in METRICS:
                row[f"{p}_{key}"] = median(g[key] for g in mine)
            row[f"{p}_compute_cpu_s_per_gb"] = median(g["busy_s"] / (size / GB) for g in mine)
            row[f"{p}_host_cpu_s_per_gb"] = median(host_cpu_s(g) / (size / GB) for g in mine)
        row["speedup"] = ratio(row["cpu_e2e_s"], row["triggered_e2e_s"])
        row["stall_ratio"] = ratio(row["cpu_blocked_s"], row["triggered_blocked_s"])
        row["busy_ratio"] = ratio(row["cpu_busy_s"], row["triggered_busy_s"])
        row["triggered_blocked_share"] = ratio(row["triggered_blocked_s"], row["triggered_e2e_s"])
        row["host_cpu_ratio"] = ratio(row["triggered_host_cpu_s_per_gb"], row["cpu_host_cpu_s_per_gb"])
        if got["cpu-pipelined"]:
            row["pipelined_speedup"] = ratio(row["pipelined_e2e_s"], row["triggered_e2e_s"])
            row["pipelining_gain"] = ratio(row["cpu_e2e_s"], row["pipelined_e2e_s"])
        row["paired_speedups"] = list(paired(samples, size, e2e_ratio("cpu", "triggered")).values())
        rows.append(row)
    return rows


def calibration_transfers(samples: Sequence[dict]) -> list[dict]:
    """The samples as `kvtb simulate --calibrate` reads them: one put of `bytes` taking `seconds` (the two
    paths the model has: CPU-centric and triggered)."""
    return [{"mode": s["mode"], "direction": "put", "bytes": s["bytes"], "seconds": s["e2e_s"]}
            for s in samples if s["mode"] in ("cpu", "triggered") and s.get("rep", 0) >= 0]


def model_part(samples: Sequence[dict]) -> dict:
    """The paper's model (Tables II/III as we read them) and the same model calibrated to the samples:
    predictions at the measured sizes, and both sweeps over 32 KiB .. 5 TiB."""
    sizes = sizes_of(samples)
    cal = calibration.calibrate({"transfers": calibration_transfers(samples)}, am.default_sizes())
    fits = {(f["mode"], f["direction"]): calibration.LinearFit(f["fixed_s"], f["per_byte_s"], f["n"])
            for f in cal["fits"]}
    at_measured = calibration.fitted_speedup(fits, sizes) or []
    paper = am.sweep(am.default_sizes())
    errors = [abs(r["rel_error"]) for r in cal["comparison"]]
    return {"paper_sweep": paper, "paper_at_measured": am.sweep(sizes), "calibration": cal,
            "calibrated_at_measured": at_measured, "calibrated_sweep": cal["fitted_speedup"] or [],
            "fit_max_abs_rel_error": max(errors) if errors else None}


def transfer_ratios(rows: Sequence[dict], model: dict | None) -> dict[str, float]:
    """The ratios of the transfer figures (medians): speedup (end to end), stall ratio (compute process
    blocked), CPU per GB, the pipelined path's, and the models' speedups."""
    if not rows:
        return {}
    first, last = rows[0], rows[-1]
    out = {"speedup_min": min(r["speedup"] for r in rows), "speedup_max": max(r["speedup"] for r in rows),
           "speedup_smallest": first["speedup"], "speedup_largest": last["speedup"],
           "stall_ratio_min": min(r["stall_ratio"] for r in rows),
           "stall_ratio_max": max(r["stall_ratio"] for r in rows),
           "stall_ratio_smallest": first["stall_ratio"], "stall_ratio_largest": last["stall_ratio"],
           "busy_ratio_min": min(r["busy_ratio"] for r in rows),
           "compute_cpu_triggered_vs_cpu_largest": ratio(last["triggered_busy_s"], last["cpu_busy_s"]),
           # the host's CPU (compute process and agent), triggered / CPU-centric: the work the triggered path
           # moves to the agent still runs on this host's cores
           "host_cpu_triggered_vs_cpu_largest": last["host_cpu_ratio"],
           "triggered_blocked_share_max": max(r["triggered_blocked_share"] for r in rows)}
    if "pipelined_speedup" in last:
        out |= {"pipelined_over_triggered_largest": last["pipelined_speedup"],
                "cpu_over_pipelined_largest": last["pipelining_gain"]}
    if model:
        cal = [r["speedup"] for r in model["calibrated_sweep"]]
        paper = [r["speedup"] for r in model["paper_sweep"]]
        if cal:
            out |= {"calibrated_speedup_min": min(cal), "calibrated_speedup_max": max(cal),
                    "calibrated_speedup_5TiB": model["calibrated_sweep"][-1]["speedup"]}
        out |= {"paper_model_speedup_min": min(paper), "paper_model_speedup_max": max(paper)}
        if model["fit_max_abs_rel_error"] is not None:
            out["calibrated_fit_max_abs_rel_error"] = model["fit_max_abs_rel_error"]
    return out


def markdown_table(head: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)
