"""Fit the analytical model's per-path costs to the testbed's own measured transfers.

Input schema (what `kvtb bench datapath` writes):

    {"transfers": [
        {"mode": "triggered" | "cpu", "direction": "put" | "get", "bytes": int, "seconds": float},
        ...
    ]}

`bytes` is one transfer's payload (one chunk as the benchmark moved it) and `seconds` its wall time
from issue to completion. The list may sit under a `transfers` key anywhere in a bigger JSON object
(a benchmark's whole output); every such list found is used. Extra keys in an entry are ignored;
entries whose mode is neither `cpu` nor `triggered` (e.g. `resident`) are skipped.

The fit: per (mode, direction), seconds = fixed_s + per_byte_s * bytes, the model's per-chunk form
(fixed_s stands for the path's summed latencies of Table III, per_byte_s for its summed (CPU) or
bottleneck (triggered) inverse bandwidths of Table II). Weighted least squares with weights
1/seconds, so that every size counts by its relative error, not its absolute time.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import analytical_model as am
from bench import stats

logger = logging.getLogger(__name__)

MODES = ("cpu", "triggered")
DIRECTIONS = ("put", "get")


@dataclass(frozen=True)
class Transfer:
    """One measured transfer."""

    mode: str
    direction: str
    bytes: int
    seconds: float


@dataclass(frozen=True)
class LinearFit:
    """seconds = fixed_s + per_byte_s * bytes, fitted on n transfers."""

    fixed_s: float
    per_byte_s: float
    n: int

    def predict_s(self, num_bytes: float) -> float:
        """Predicted seconds for one transfer of num_bytes."""
        return self.fixed_s + self.per_byte_s * num_bytes

    @property
    def bytes_per_s(self) -> float:
        """The asymptotic bandwidth 1 / per_byte_s."""
        return stats.ratio(1.0, self.per_byte_s)


def find_transfers(obj: Any) -> list[dict]:
    """Every entry of every list under a `transfers` key, searched recursively through obj."""
    found: list[dict] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "transfers" and isinstance(value, list):
                found.extend(v for v in value if isinstance(v, dict))
            else:
                found.extend(find_transfers(value))
    elif isinstance(obj, list):
        for value in obj:
            found.extend(find_transfers(value))
    return found


def parse_transfers(obj: Any) -> list[Transfer]:
    """Validated transfers of modes cpu/triggered from a results object; ValueError on bad entries."""
    out = []
    for i, entry in enumerate(find_transfers(obj)):
        try:
            t = Transfer(str(entry["mode"]), str(entry["direction"]), int(entry["bytes"]),
                         float(entry["seconds"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"transfer {i}: needs mode, direction, bytes, seconds ({exc})") from exc
        if t.mode not in MODES:
            logger.debug("skipping transfer %d of mode %s", i, t.mode)
            continue
        if t.direction not in DIRECTIONS or t.bytes <= 0 or t.seconds <= 0:
            raise ValueError(f"transfer {i}: bad direction, bytes or seconds: {entry}")
        out.append(t)
    if not out:
        raise ValueError("no transfers of mode cpu or triggered found under a 'transfers' key")
    return out


def fit_linear(sizes: Iterable[float], seconds: Iterable[float]) -> LinearFit:
    """Weighted (1/seconds) least squares of seconds = fixed_s + per_byte_s * bytes, both >= 0."""
    x = np.asarray(list(sizes), dtype=float)
    y = np.asarray(list(seconds), dtype=float)
    w = 1.0 / y
    if len(np.unique(x)) >= 2:
        a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
        (fixed_s, per_byte_s), *_ = np.linalg.lstsq(a, y * w, rcond=None)
        if fixed_s >= 0 and per_byte_s >= 0:
            return LinearFit(float(fixed_s), float(per_byte_s), len(x))
        if fixed_s < 0 <= per_byte_s:
            return _per_byte_only(x, y, w)
        return LinearFit(float(np.sum(w * w * y) / np.sum(w * w)), 0.0, len(x))
    return _per_byte_only(x, y, w)


def _per_byte_only(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> LinearFit:
    # One size (or a negative intercept): fit through the origin, seconds = per_byte_s * bytes.
    per_byte_s = float(np.sum(w * w * x * y) / np.sum(w * w * x * x))
    return LinearFit(0.0, per_byte_s, len(x))


def fit_paths(transfers: list[Transfer]) -> dict[tuple[str, str], LinearFit]:
    """One LinearFit per (mode, direction) present."""
    groups: dict[tuple[str, str], list[Transfer]] = {}
    for t in transfers:
        groups.setdefault((t.mode, t.direction), []).append(t)
    return {key: fit_linear([t.bytes for t in ts], [t.seconds for t in ts])
            for key, ts in sorted(groups.items())}


def compare(transfers: list[Transfer], fits: dict[tuple[str, str], LinearFit]) -> list[dict]:
    """Per (mode, direction, bytes): measured median beside the fitted and the paper's prediction."""
    groups: dict[tuple[str, str, int], list[float]] = {}
    for t in transfers:
        groups.setdefault((t.mode, t.direction, t.bytes), []).append(t.seconds)
    rows = []
    for (mode, direction, size), secs in sorted(groups.items()):
        measured_s = stats.median(secs)
        fitted_s = fits[(mode, direction)].predict_s(size)
        rows.append({
            "mode": mode, "direction": direction, "bytes": size, "n": len(secs),
            "measured_s": measured_s, "fitted_s": fitted_s,
            "rel_error": (fitted_s - measured_s) / measured_s,
            "paper_model_s": paper_model_s(mode, direction, size),
        })
    return rows


def paper_model_s(mode: str, direction: str, num_bytes: int,
                  p: am.ModelParams = am.ModelParams()) -> float | None:
    """The paper-parameter model's time for one put of num_bytes (None for get: not modelled)."""
    if direction != "put":
        return None
    return am.cpu_centric_s(num_bytes, p) if mode == "cpu" else am.triggered_s(num_bytes, p)


def fitted_speedup(fits: dict[tuple[str, str], LinearFit], sizes: list[int],
                   chunk_bytes: int = am.ModelParams().chunk_bytes) -> list[dict] | None:
    """The fitted model's put speedup (cpu / triggered) over sizes, chunked like the paper's model."""
    if ("cpu", "put") not in fits or ("triggered", "put") not in fits:
        return None
    rows = []
    for size in sizes:
        parts = am.split_chunks(size, chunk_bytes)
        cpu = sum(n * fits[("cpu", "put")].predict_s(m) for m, n in parts)
        trig = sum(n * fits[("triggered", "put")].predict_s(m) for m, n in parts)
        rows.append({"bytes": size, "cpu_s": cpu, "triggered_s": trig, "speedup": stats.ratio(cpu, trig)})
    return rows


def measured_speedup(rows: list[dict]) -> list[dict]:
    """Per put size measured in both modes: median cpu seconds / median triggered seconds."""
    by_key = {(r["mode"], r["bytes"]): r["measured_s"] for r in rows if r["direction"] == "put"}
    return [{"bytes": size, "speedup": stats.ratio(by_key[("cpu", size)], by_key[("triggered", size)])}
            for mode, size in sorted(by_key) if mode == "cpu" and ("triggered", size) in by_key]


def calibrate(results: Any, sizes: list[int]) -> dict:
    """Fit, compare and project: the whole --calibrate result as one JSON-ready dict."""
    transfers = parse_transfers(results)
    fits = fit_paths(transfers)
    rows = compare(transfers, fits)
    return {
        "fits": [{"mode": m, "direction": d, "fixed_s": f.fixed_s, "per_byte_s": f.per_byte_s,
                  "bytes_per_s": f.bytes_per_s, "n": f.n} for (m, d), f in fits.items()],
        "comparison": rows,
        "measured_speedup": measured_speedup(rows),
        "fitted_speedup": fitted_speedup(fits, sizes),
    }
