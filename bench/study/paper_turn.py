"""The paper's Fig. 2 for `kvtb study paper`: a first turn and a follow-up that restores, through the whole
stack (frontend, agent, compute node, storage node), and its eight steps on one time axis from the turns'
records, as `kvtb chat --trace` shows them. The Gantt data (`gantt`, `follow_up_figures`) is pure; the
turn and the plot are not.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtb import steps as kv_steps

logger = logging.getLogger(__name__)

# -- Fig. 2 (pure) ------------------------------------------------------------------------------------

def turn_record(summary) -> dict:
    """A frontend TurnSummary as `kvtb chat --json` prints it, with its start (unix ns) kept."""
    from chat_client.record import summary_to_dict

    return summary_to_dict(summary) | {"turn_start_unix_ns": summary.turn_start_unix_ns}


def gantt(records: Sequence[dict]) -> dict:
    """The steps of a first turn and its follow-up on one time axis (ms from the first turn's start):
    rows {step, name, turn, start_ms, end_ms, bytes} by turn then start, the turns' spans, and which
    steps are present. A step that ended long before the first turn (step 1 rides on the first turn
    after the compute node started) is marked `before` (drawn clipped at the axis' left end)."""
    if not records:
        raise ValueError("no turn records")
    base = records[0]["turn_start_unix_ns"]
    rows, turns = [], []
    for rec in records:
        offset = (rec["turn_start_unix_ns"] - base) / 1e6
        turns.append({"turn": rec["turn"], "start_ms": offset, "end_ms": offset + rec["e2e_ms"],
                      "kv_source": rec["kv_source"]})
        for s in rec["steps"]:
            rows.append({"step": s["step"], "name": s["name"] or kv_steps.name(s["step"]),
                         "turn": rec["turn"], "start_ms": offset + s["start_ms"],
                         "end_ms": offset + s["end_ms"],
                         "bytes": s["bytes"]})
    span = max([t["end_ms"] for t in turns] + [r["end_ms"] for r in rows])
    for r in rows:
        r["before"] = r["end_ms"] < -0.25 * span  # far before the first turn: clipped on the plot
    rows.sort(key=lambda r: (r["turn"], r["start_ms"], r["step"]))
    left = min([0.0] + [r["start_ms"] for r in rows if not r["before"]])
    return {"rows": rows, "turns": turns, "span_ms": span, "left_ms": left,
            "steps_present": sorted({r["step"] for r in rows})}


def follow_up_figures(g: dict) -> dict[str, float]:
    """The follow-up's (the last turn's) restore, ms: each of steps 5-8's duration (`step5_ms` ...) and when
    its inference (step 8) started after its lookup (step 5) began; absent steps are left out."""
    last = g["turns"][-1]["turn"]
    rows = [r for r in g["rows"] if r["turn"] == last]
    out: dict[str, float] = {}
    for n in (kv_steps.Step.LOOKUP, kv_steps.Step.GET, kv_steps.Step.RESTORE, kv_steps.Step.FOLLOW_UP):
        got = [r for r in rows if r["step"] == n]
        if got:
            out[f"step{int(n)}_ms"] = max(r["end_ms"] for r in got) - min(r["start_ms"] for r in got)
    five = [r["start_ms"] for r in rows if r["step"] == kv_steps.Step.LOOKUP]
    eight = [r["start_ms"] for r in rows if r["step"] == kv_steps.Step.FOLLOW_UP]
    if five and eight:
        out["inference_after_lookup_ms"] = min(eight) - min(five)
    return out


STEP_COLORS = {1: "#7f7f7f", 2: "#1f77b4", 3: "#2ca02c", 4: "#9467bd", 5: "#ff7f0e", 6: "#d62728",
               7: "#8c564b", 8: "#17becf"}


def _gantt_panel(ax, rows: list[dict], turns: list[dict], left: float, right: float, title: str) -> None:
    """One panel: a bar per row on [left, right] (ms); rows that end before `left` are drawn clipped."""
    pad = 0.04 * ((right - left) or 1.0)
    x0 = left - pad
    for t in turns:
        ax.axvspan(t["start_ms"], t["end_ms"], color="#f0f0f0", zorder=0)
        if left <= t["start_ms"] <= right:
            ax.annotate(f" turn {t['turn']} ({t['kv_source']})", xy=(t["start_ms"], 0.01),
                        xycoords=("data", "axes fraction"), va="bottom", fontsize=8, color="grey")
    for y, r in enumerate(rows):
        color = STEP_COLORS.get(r["step"], "grey")
        took = r["end_ms"] - r["start_ms"]
        if r["end_ms"] < left:  # wholly before the axis: a clipped stub saying when
            ax.barh(y, pad * 0.8, left=x0, color=color, hatch="//", alpha=0.6)
            ax.annotate(f"{took:.0f} ms, {-r['start_ms'] / 1000:.1f} s before turn 1", xy=(x0 + pad, y),
                        va="center", fontsize=7)
            continue
        width = max(took, (right - left) * 0.002)
        ax.barh(y, width, left=r["start_ms"], color=color)
        text = f"{took:.1f} ms" + (f", {r['bytes'] / 1e6:.2f} MB" if r["bytes"] else "")
        ax.annotate(text, xy=(r["start_ms"] + width, y), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['step']}. {r['name']} (turn {r['turn']})" for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(x0, right + 0.22 * (right - left))
    ax.set(title=title, xlabel="ms from the first turn's start")
    ax.grid(True, axis="x", alpha=0.3)


def plot_gantt(path: Path, g: dict, title: str) -> Path | None:
    """The steps as horizontal bars on one time axis, and the follow-up's alone below it (its restore is
    short beside the turns' inference); PNG, or None with a warning without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("no plot %s: matplotlib is not installed (pip install -e '.[bench]')", path.name)
        return None
    rows, last = g["rows"], g["turns"][-1]
    follow = [r for r in rows if r["turn"] == last["turn"]]
    fig = Figure(figsize=(10, 0.42 * (len(rows) + len(follow)) + 2.6), dpi=120)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [len(rows) + 1, len(follow) + 1]})
    _gantt_panel(top, rows, g["turns"], g["left_ms"], g["span_ms"], title)
    end = max([last["end_ms"]] + [r["end_ms"] for r in follow])
    _gantt_panel(bottom, follow, [last], last["start_ms"], end,
                 f"turn {last['turn']} alone ({last['kv_source']})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


# -- Fig. 2 (a real turn and its follow-up) --------------------------------------------------------------

def cached_tiny_model() -> Path:
    """The --smoke model, made once per user in the cache directory (it is deterministic: seed 0), so
    that a smoke run does not pay transformers' import and a save every time; made in a temp directory
    beside it and renamed into place, so that a run never finds half of it."""
    import tempfile

    from bench.study.tiny_model import make_tiny_model

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtb"
    target = cache / "study-tiny-model-v1"
    if (target / "config.json").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-model-", dir=cache))
    make_tiny_model(staging)
    try:
        staging.rename(target)
    except OSError:  # another run put it there first
        shutil.rmtree(staging, ignore_errors=True)
    return target


FIRST_MESSAGE = "Please give me a short recipe for cheesecake."
FOLLOW_UP = "Only give temperatures in °C from now on. What temperature should I set the oven to?"


def measure_turn(directory: Path, smoke: bool, max_new_tokens: int, keep_data: bool,
                 placement: str = "shared") -> dict:
    """A first turn and a follow-up through the whole stack (policy triggered, started in `placement`);
    their records."""
    from bench.stack import Stack, bench_config
    from chat_client.client import FrontendClient

    compute: dict[str, Any] = {}
    if smoke:
        compute["model_cache_dir"] = str(cached_tiny_model())
    config = bench_config(users=1, max_new_tokens=max_new_tokens, pool_tokens=4096, max_context_tokens=2048,
                          compute=compute)
    with Stack(directory / "fig2", config, policy="triggered", keep_data=keep_data,
               placement=placement) as stack:
        client = FrontendClient(stack.frontend, stack.token("u0"))
        try:
            client.wait_ready(30)
            records, context = [], ""
            for message in (FIRST_MESSAGE, FOLLOW_UP):
                summary = None
                for event in client.chat(message, context, max_new_tokens):
                    if event.WhichOneof("event") == "summary":
                        summary = event.summary
                if summary is None:
                    raise RuntimeError("the turn ended without its summary")
                context = summary.context_id
                records.append(turn_record(summary))
                time.sleep(0.5)  # the user reads the reply (the first turn's last PUTs end meanwhile)
        finally:
            client.close()
    return {"records": records, "gantt": gantt(records)}
