"""Benchmark output: raw results JSON in an output directory, PNG plots, one JSON object, text tables."""
from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Sequence, TextIO

logger = logging.getLogger(__name__)


def _jsonable(obj: Any) -> Any:
    """Make floats JSON-safe (inf and nan become strings) and numpy scalars plain."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def dumps(obj: Any, indent: int | None = None) -> str:
    """JSON text of obj, with inf/nan as strings so every reader can parse it."""
    return json.dumps(_jsonable(obj), indent=indent)


def write_json(out_dir: str | Path, name: str, obj: Any) -> Path:
    """Write obj as indented JSON to out_dir/name (directories created); return the path."""
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(obj, indent=2) + "\n")
    logger.info("wrote %s", path)
    return path


def emit_json(obj: Any, stream: TextIO | None = None) -> None:
    """Print obj as one JSON object on one line (the `--json` output of every command)."""
    out = stream or sys.stdout
    out.write(dumps(obj) + "\n")
    out.flush()


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: columns padded, numbers right-aligned, a dashed rule under the header."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule] + [line(row) for row in cells])


def _is_number(v: Any) -> bool:
    if isinstance(v, str):  # pre-formatted numbers such as "1.000" or "+3.2%" align right too
        try:
            float(v.rstrip("%x"))
        except ValueError:
            return False
        return True
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_bytes(num_bytes: float) -> str:
    """Binary units: 32768 -> '32 KiB', 5 * 2**40 -> '5 TiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.4g} {unit}"
        value /= 1024
    return f"{value:.4g} TiB"


def format_seconds(seconds: float) -> str:
    """Human time: 3.3e-3 -> '3.3 ms', 1.7e-6 -> '1.7 us', 3600.0 -> '3600 s'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def plot_lines(path: str | Path, series: dict[str, tuple[Sequence[float], Sequence[float]]], *,
               title: str, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False,
               hlines: dict[str, float] | None = None) -> Path:
    """Save a line plot (one line per series label, optional labelled horizontal lines) as PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", markersize=3, label=label)
    for label, y in (hlines or {}).items():
        ax.axhline(y, linestyle="--", linewidth=1, color="grey")
        ax.annotate(label, xy=(0.01, y), xycoords=("axes fraction", "data"), fontsize=8, color="grey")
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    logger.info("wrote %s", path)
    return path
