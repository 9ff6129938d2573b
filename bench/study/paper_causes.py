"""The experiments that separate the paper's causes (issue 43, item 3): `results["causes"] = measure(...)`.

- decode (bench.study.paper_decode): compute freed, as compute: a decode's TBT while its blocks leave by
  each policy, and the host's CPU beyond the resident decode's per GB offloaded;
- transfers (bench.study.paper_get): "transfer and retrieval": a context's PUT and GET, CPU-centric and
  triggered, by size, each with every process's CPU time (the host's CPU s/GB);
- kv_size (bench.study.paper_kv_size): Fig. 1 by arithmetic;
- latency (bench.study.paper_latency): Fig. 4, the storage node's Store/Retrieve against the raw disk's
  write+fsync and read, 512 B up to 32 MiB (quick) or 128 MiB (full).

Each measured part runs >= 3 repeats in quick and full mode (smoke: 1, its claims then inconclusive). A
part that fails is recorded in `failed` (its claims come out not measured); the others still run. The
claims are `CLAIMS` (bench.study.paper_causes_claims), judged by report.judge on the study's results.
Budget, as planned: quick about 3 minutes (the decode about 2 with the model's load, transfers and
latency under a minute together), smoke about 20 s.
"""
from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.study import paper_decode, paper_get, paper_kv_size, paper_latency
from bench.results import format_bytes
from bench.study.paper_causes_claims import CLAIMS, SEED, host_cpu_s, largest_size, paired  # noqa: F401 - CLAIMS

logger = logging.getLogger(__name__)

MIB = 1 << 20
MODES = ("full", "quick", "smoke")
TRANSFER_SIZES = {"full": (MIB, 8 * MIB, 64 * MIB, 256 * MIB), "quick": (MIB, 8 * MIB, 32 * MIB),
                  "smoke": (256 * 1024,)}
REPEATS = {"full": 7, "quick": 5, "smoke": 1}  # transfers and latency (cheap); the decode: paper_decode


def steps(mode: str) -> int:
    """Progress steps measure(mode) reports (for the caller's Progress total)."""
    return (1 + paper_decode.REPEATS[mode]) + len(TRANSFER_SIZES[mode]) * REPEATS[mode] + REPEATS[mode]


def _run(out: dict, name: str, fn: Callable[[], Any]) -> Any:
    """fn(); its result under out[name], or its error under out["failed"][name] (never raised)."""
    started = time.monotonic()
    try:
        out[name] = fn()
        return out[name]
    except Exception as exc:  # noqa: BLE001 - a failed part is reported, the others go on
        logger.error("causes part %s failed: %s\n%s", name, exc, traceback.format_exc(limit=8))
        out["failed"][name] = f"{type(exc).__name__}: {exc}"
        return None
    finally:
        out["part_seconds"][name] = time.monotonic() - started


def measure(directory: Path, mode: str, progress, keep_data: bool = False) -> dict:
    """Every part in `mode` ("full", "quick" or "smoke"); what results["causes"] holds."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {MODES}")
    from bench.stack import use_credentials

    directory = Path(directory)
    use_credentials(directory)  # every service of the parts, and the compute process, share them
    repeats = REPEATS[mode]
    out: dict[str, Any] = {"mode": mode, "failed": {}, "part_seconds": {}, "seed": SEED}
    _run(out, "kv_size", paper_kv_size.measure)

    def rig_parts() -> None:
        with paper_get.rig(directory / "rig") as r:
            def transfers() -> dict:
                samples = []
                for i, size in enumerate(TRANSFER_SIZES[mode]):
                    samples += paper_get.measure_size(r, size, repeats, progress, first=i)
                return {"samples": samples, "sizes": list(TRANSFER_SIZES[mode]), "repeats": repeats}

            def latency() -> dict:
                sizes = paper_latency.SIZES[mode]
                samples = paper_latency.measure(r.admin, paper_get.NSID, r.directory.parent / "raw", sizes,
                                                repeats, progress)
                return {"samples": samples, "sizes": list(sizes), "repeats": repeats,
                        "ops_per_repeat": {str(s): paper_latency.ops_for(s) for s in sizes}}
            _run(out, "transfers", transfers)
            _run(out, "latency", latency)

    if _run(out, "rig", rig_parts) is None and "rig" in out["failed"]:
        for part in ("transfers", "latency"):  # the rig did not start: both parts say why
            out["failed"].setdefault(part, out["failed"]["rig"])
    out.pop("rig", None)
    _run(out, "decode", lambda: paper_decode.measure(directory, mode, progress, keep_data))
    return out


# -- the headline (pure) -------------------------------------------------------------------------------------

def _causes_of(results: Mapping[str, Any]) -> Mapping[str, Any]:
    return results["causes"] if "causes" in results else results


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def headline_rows(results: Mapping[str, Any]) -> list[dict]:
    """The README headline's "compute freed" row, {question, measured, target} (results: the study's
    results holding "causes", or the causes dict itself)."""
    causes = _causes_of(results)
    question = "Compute freed: a decode's TBT beside triggered vs CPU-centric offload; host CPU s/GB stored"
    target = "the paper: triggered operations do not involve the CPU beyond the trigger setup"
    decode = causes.get("decode")
    if decode is None:
        error = (causes.get("failed") or {}).get("decode", "did not run")
        return [{"question": question, "measured": f"failed: {error}", "target": target}]
    tbt = {p: _mean(s["tbt_ms"] for s in decode["samples"] if s["policy"] == p)
           for p in ("resident", "triggered", "cpu")}
    measured = (f"TBT {tbt['triggered']:.1f} ms beside triggered vs {tbt['cpu']:.1f} ms beside CPU-centric "
                f"offload ({tbt['resident']:.1f} ms with none offloaded)")
    transfers = causes.get("transfers")
    if transfers:
        size = largest_size(transfers["samples"])
        per = {m: _mean(paired(transfers["samples"], "put", size,
                               lambda r, m=m: host_cpu_s(r[m]) / (r[m]["bytes"] / 1e9)).values())
               for m in ("triggered", "cpu")}
        measured += (f"; host CPU (compute process, agent, storage node) per GB stored, {format_bytes(size)} "
                     f"PUTs: {per['triggered']:.2f} s/GB triggered vs {per['cpu']:.2f} s/GB CPU-centric")
    return [{"question": question, "measured": measured, "target": target,
             "claim": "sec5b_decode_beside_triggered"}]
