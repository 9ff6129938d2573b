"""The poster study's plots: one quantity per axis (panels side by side), every repeat drawn, the poster's own
marks where it gives numbers (it gives no curve values: its 30%/50% minimum and <= 40% range in Fig. 5, its
12% in Fig. 6), and the time axis named virtual under a hardware profile."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from bench.study import overhead as ov
from bench.study.poster_runner import POLL_S

logger = logging.getLogger(__name__)

THROUGHPUT_BIN_S = 1.0
PANELS = (("engine_total_s", "engine time in preemption work (s)\n(the claims' measure)"),
          ("extra_e2e_s", "extra end to end (s)\nvs the ample pool"),
          ("extra_cpu_s", "extra CPU time of the\nserving processes (s)"))
SWEEPS = (("fig2", "block size (tokens)", "Fig. 2: overhead by block size", True),
          ("fig4", "sequence length (input + output tokens), batch 16", "Fig. 4: overhead by sequence length", False),
          ("fig5", "KV memory available (share of what the batch needs)", "Fig. 5: overhead by KV memory", False))


def _figure(ncols: int, nrows: int = 1):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("no poster plots: matplotlib is not installed (pip install -e '.[bench]')")
        return None
    fig = Figure(figsize=(4.6 * ncols, 3.8 * nrows), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    logger.info("wrote %s", path)
    return path


def _points(rows: Mapping, strategy: str, key: str) -> tuple[list[float], list[float], list[list[float]]]:
    """xs, the mean, and every repeat's value at each x."""
    pts = sorted((float(x), by[strategy]) for x, by in rows.items() if (by or {}).get(strategy))
    return ([x for x, _ in pts], [r[key] for _, r in pts], [[rep[key] for rep in r["repeats"]] for _, r in pts])


def sweep_plot(rows: Mapping, fig_name: str, xlabel: str, title: str, logx: bool, out: Path,
               virtual: bool = False) -> Path | None:
    """One panel per quantity; a line per strategy through the means, a dot per repeat. Under a profile the
    engine and end-to-end seconds are virtual (the CPU seconds stay this machine's)."""
    strategies = sorted({s for by in rows.values() for s, r in (by or {}).items() if r})
    fig = _figure(len(PANELS)) if strategies else None
    if fig is None:
        return None
    for k, (key, ylabel) in enumerate(PANELS):
        ax = fig.add_subplot(1, len(PANELS), k + 1)
        for s in strategies:
            xs, mean, reps = _points(rows, s, key)
            line, = ax.plot(xs, mean, marker="o", markersize=3, label=s)
            for x, vs in zip(xs, reps):
                ax.plot([x] * len(vs), vs, linestyle="none", marker=".", alpha=0.4, color=line.get_color())
        if fig_name == "fig5":
            ax.axvspan(0, 0.4, color="grey", alpha=0.08, label="poster: falls up to 40%")
            for x in (0.3, 0.5):
                ax.axvline(x, linestyle="--", linewidth=1, color="grey")
        ax.axhline(0, linewidth=0.6, color="black")
        if logx:  # block sizes: powers of two, labelled as they are
            ticks = sorted({float(x) for x in rows})
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
            ax.minorticks_off()
        if virtual and key != "extra_cpu_s":
            ylabel = ylabel.replace("(s)", "(virtual s)")
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        if k == 0:
            ax.legend(fontsize=7)
    fig.suptitle(title + (" (dashed: the poster's lowest at 30% or 50%)" if fig_name == "fig5" else ""))
    return _save(fig, out / f"{fig_name}.png")


def tokens_plot(f5: Mapping, out: Path, virtual: bool = False) -> Path | None:
    """Fig. 3: each repeat's evicted tokens against its engine time, per strategy (Fig. 5's runs)."""
    fig = _figure(1) if f5 else None
    if fig is None:
        return None
    ax = fig.add_subplot(1, 1, 1)
    for s in sorted({s for by in f5.values() for s, r in (by or {}).items() if r}):
        pts = sorted((rep["evicted_tokens"], rep["engine_total_s"]) for by in f5.values() if (by or {}).get(s)
                     for rep in by[s]["repeats"])
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, linestyle="none", label=s)
    ax.set(title="Fig. 3: overhead by evicted tokens (Fig. 5's runs, every repeat)",
           xlabel="tokens evicted (preempted KV tokens)",
           ylabel=f"engine time in preemption work ({'virtual ' if virtual else ''}s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out / "fig3.png")


def timeline_plot(rows: Mapping, share: float, out: Path, virtual: bool) -> Path | None:
    """Fig. 6: per strategy (a column), KV usage with its preemptions marked (top) and throughput (bottom),
    the first repeat."""
    strategies = [s for s, r in rows.items() if r]
    fig = _figure(len(strategies), 2) if strategies else None
    if fig is None:
        return None
    axis = "virtual time (s): wall / D under the profile" if virtual else "time (s)"
    for k, s in enumerate(strategies):
        rep = rows[s]["repeats"][0]
        samples = rep["samples"]
        usage = fig.add_subplot(2, len(strategies), k + 1)
        usage.plot([x[0] for x in samples], [x[1] * 100 for x in samples], linewidth=1, marker=".")
        for a, b in zip(samples, samples[1:]):
            if b[4] > a[4]:
                usage.axvline(b[0], color="red", alpha=0.25, linewidth=1)
        usage.set(title=f"{s}: KV usage (red: a preemption)", ylabel="KV cache usage (%)", xlabel=axis)
        tput = fig.add_subplot(2, len(strategies), len(strategies) + k + 1, sharex=usage)
        series = ov.rebin(rep["throughput"], max(1, round(THROUGHPUT_BIN_S / POLL_S)))
        tput.plot([t for t, _ in series], [v for _, v in series], linewidth=1, marker=".")
        tput.set(title=f"{s}: throughput", ylabel=f"tokens/s (mean over {THROUGHPUT_BIN_S:g} s)", xlabel=axis)
        for ax in (usage, tput):
            ax.grid(True, alpha=0.3)
    fig.suptitle(f"Fig. 6 at {share:.0%} of the need (the poster's: 12%), first repeat")
    return _save(fig, out / "fig6.png")


def make_plots(results: Mapping, out: Path, virtual: bool = False, fig6_share: float | None = None) -> list:
    """Every plot of the page that has data."""
    paths: list[Path | None] = [sweep_plot(results.get(f, {}), f, xl, t, logx, out, virtual)
                                for f, xl, t, logx in SWEEPS]
    f5 = results.get("fig5", {})
    paths.append(tokens_plot(f5, out, virtual))
    key = _share_key(f5, fig6_share)
    if key is not None:
        paths.append(timeline_plot(f5[key] or {}, float(key), out, virtual))
    return [p for p in paths if p]


def _share_key(f5: Mapping, share: float | None) -> str | None:
    if not f5:
        return None
    if share is not None:
        for k in f5:
            if abs(float(k) - share) < 1e-9:
                return k
    return min(f5, key=float)
