"""The plots of `kvtb study paper`: one quantity per axis (a panel each), the paper's numbers beside ours
where its text gives them, and virtual time labelled as such under a profile."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import analytical_model as am

logger = logging.getLogger(__name__)

Series = dict[str, tuple[Sequence[float], Sequence[float]]]
PAPER_SMALL = "the paper's text: 23x at small sizes"
PAPER_LARGE = "the paper's text: >19x at larger sizes"


@dataclass
class Panel:
    """One axis: one quantity (its label says which and its unit), its series and labelled lines."""
    title: str
    ylabel: str
    series: Series
    hlines: dict[str, float] = field(default_factory=dict)
    logy: bool = True


def draw(path: Path, title: str, xlabel: str, panels: Sequence[Panel]) -> Path | None:
    """The panels side by side on a log x axis (PNG), or None with a warning without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("no plot %s: matplotlib is not installed (pip install -e '.[bench]')", path.name)
        return None
    fig = Figure(figsize=(6.5 * len(panels), 4.8), dpi=120)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, p in zip(axes, panels):
        for label, (xs, ys) in p.series.items():
            single = len(list(xs)) == 1
            ax.plot(list(xs), list(ys), marker="*" if single else "o", markersize=10 if single else 3,
                    linestyle="none" if single else "-", label=label)
        for label, y in p.hlines.items():
            ax.axhline(y, linestyle="--", linewidth=1, color="grey")
            ax.annotate(label, xy=(0.01, y), xycoords=("axes fraction", "data"), fontsize=8, color="grey")
        ax.set_xscale("log")
        ax.set_yscale("log" if p.logy else "linear")
        ax.set(title=p.title, xlabel=xlabel, ylabel=p.ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _col(rows: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    got = [(r["bytes"], r[key]) for r in rows if r.get(key) is not None]
    return [g[0] for g in got], [g[1] for g in got]


def _paper_speedup(xs: Sequence[float]) -> tuple[Series, dict[str, float]]:
    """The paper's Fig. 7 as its text gives it: 23x at the smallest size, a line at 19x for the larger."""
    return {PAPER_SMALL: ([xs[0]], [am.PAPER_SPEEDUP_MAX])}, {PAPER_LARGE: am.PAPER_SPEEDUP_MIN}


def transfer_plots(out: Path, rows: list[dict], model: dict | None) -> list[Path | None]:
    """Figs. 5, 6 and 7 measured here (real time): one quantity per panel."""
    xs = [r["bytes"] for r in rows]
    until = {"CPU-centric": _col(rows, "cpu_e2e_s"), "CPU-centric, pipelined": _col(rows, "pipelined_e2e_s"),
             "triggered": _col(rows, "triggered_e2e_s")}
    if model and model["calibrated_at_measured"]:
        cal = model["calibrated_at_measured"]
        cx = [c["bytes"] for c in cal]
        until["model calibrated here, CPU-centric"] = (cx, [c["cpu_s"] for c in cal])
        until["model calibrated here, triggered"] = (cx, [c["triggered_s"] for c in cal])
    blocked = {"CPU-centric": _col(rows, "cpu_blocked_s"), "CPU-centric, pipelined": _col(rows, "pipelined_blocked_s"),
               "triggered": _col(rows, "triggered_blocked_s")}
    cpu = {"compute process, CPU-centric": _col(rows, "cpu_compute_cpu_s_per_gb"),
           "compute process, triggered": _col(rows, "triggered_compute_cpu_s_per_gb"),
           "host (with the emulated NIC), CPU-centric": _col(rows, "cpu_host_cpu_s_per_gb"),
           "host (with the emulated NIC), triggered": _col(rows, "triggered_host_cpu_s_per_gb")}
    paths = [draw(out / "fig5_transfer_time.png", "Fig. 5: KV transfer to a storage node (measured, real time)",
                  "KV size (bytes)",
                  [Panel("until the last block is stored", "seconds until stored", _drop_empty(until)),
                   Panel("compute process blocked", "seconds blocked", _drop_empty(blocked)),
                   Panel("CPU time per GB moved", "CPU seconds per GB", _drop_empty(cpu))])]
    if model:
        large: Series = {}
        for label, sweep in (("model calibrated here", model["calibrated_sweep"]),
                             ("paper's Tables II/III", model["paper_sweep"])):
            if sweep:
                sx = [s["bytes"] for s in sweep]
                large[f"{label}, CPU-centric"] = (sx, [s["cpu_s"] for s in sweep])
                large[f"{label}, triggered"] = (sx, [s["triggered_s"] for s in sweep])
        large["measured CPU-centric"] = until["CPU-centric"]
        large["measured triggered"] = until["triggered"]
        paths.append(draw(out / "fig6_large.png", "Fig. 6: to 5 TiB (models), beside the measured sizes",
                          "KV size (bytes)", [Panel("until stored", "seconds until stored", large)]))
    speed, lines = _paper_speedup(xs)
    speed = {"measured, CPU-centric / triggered": _col(rows, "speedup"),
             "measured, CPU-centric pipelined / triggered": _col(rows, "pipelined_speedup"), **speed}
    if model:
        for label, sweep in (("model calibrated here", model["calibrated_sweep"]),
                             ("paper's Tables II/III (kvtb simulate)", model["paper_sweep"])):
            if sweep:
                speed[label] = ([s["bytes"] for s in sweep], [s["speedup"] for s in sweep])
    stall = {"measured, CPU-centric / triggered": _col(rows, "stall_ratio")}
    paths.append(draw(out / "fig7_speedup.png", "Fig. 7: triggered against CPU-centric (measured, real time)",
                      "KV size (bytes)",
                      [Panel("speedup until stored", "speedup (x), until stored", _drop_empty(speed), lines),
                       Panel("compute process blocked (not the paper's quantity)",
                             "stall ratio (x), time blocked", stall)]))
    return paths


def scaled_plots(out: Path, result: dict) -> list[Path | None]:
    """Under a profile: each reading's virtual times beside the model, and its speedup beside the paper's."""
    paths = []
    for reading in sorted({r["reading"] for r in result["rows"]}):
        rows = [r for r in result["rows"] if r["reading"] == reading]
        xs = [r["bytes"] for r in rows]
        times = {"CPU-centric, testbed": _col(rows, "cpu_s"), "CPU-centric, model": _col(rows, "cpu_model_s"),
                 "triggered, testbed": _col(rows, "triggered_s"), "triggered, model": _col(rows, "triggered_model_s")}
        speed, lines = _paper_speedup(xs)
        speed = {"testbed": _col(rows, "speedup"), "model": _col(rows, "model_speedup"), **speed}
        paths.append(draw(out / f"fig5_7_virtual_{reading}.png",
                          f"Figs. 5-7 under the profile, reading {reading} (virtual time: wall / D)",
                          "KV size (bytes)",
                          [Panel("until stored", "virtual seconds (wall / D)", _drop_empty(times)),
                           Panel("speedup", "speedup (x), virtual time", _drop_empty(speed), lines)]))
    return paths


def _drop_empty(series: Series) -> Series:
    return {k: v for k, v in series.items() if len(list(v[0]))}
