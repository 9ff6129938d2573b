"""`kvtb study poster`: the recompute-vs-swap poster's Figs 2-6 on the batching engine with the real model.

Three strategies for a pool that runs out, each a compute node setting (`preemption`):
`recompute` (the victim's blocks are freed, it prefills again), `swap-host` (its blocks are copied
into the compute node's host swap tier and back: vLLM's CPU swap space, the poster's "swap") and
`swap-storage` (the paper's way: preemption `swap` under policy `triggered`: its blocks are stored
by triggered PUTs to the storage node and come back by GETs). `recompute` and `swap-host` run
turns under policy `resident` (nothing offloaded, as in vLLM); `swap-storage` under `triggered`.
The compute node runs with its prefix cache off (bench.study.poster_runner.PREFIX_CACHE), so a
recompute recomputes everything that was evicted, as vLLM did at the poster's time.

A point is a batch of N requests issued at once (threads, straight to the compute node through the
agent, greedy, ignore_eos) on a compute node restarted with the point's pool, block size and
preemption (the storage node, the agent and the frontend of the one Stack stay up), run `repeats`
times, each repeat paired with a repeat on a pool that never runs out (bench.study.poster_points).
The claims (bench.study.poster_claims) are judged on the repeats by bench.study.claims.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
from pathlib import Path
from typing import Any

from bench import scaled
from bench.progress import Progress
from bench.results import services_dir
from bench.study import overhead as ov
from bench.study import poster_journal as journals
from bench.study import poster_fig6 as f6
from bench.study.poster_claims import CLAIMS, FIG6_SHARE, SEED
from bench.study.poster_page import intro_text, rows_table, scaled_note, sittings_note, storage_note
from bench.study.poster_plots import THROUGHPUT_BIN_S, make_plots
from bench.study.poster_points import STRATEGIES, Points, trim_baseline
from bench.study.poster_runner import POLL_S, PREFIX_CACHE, Runner, Workload
from bench.study.report import add_study_args, check_profile, judge, main_of, new_study

__all__ = ["CLAIMS", "SEED", "MODES", "plan", "count_runs", "fig6", "add_ratios", "headline_rows", "main"]

logger = logging.getLogger(__name__)

ALL = tuple(STRATEGIES)
HOST = ("recompute", "swap-host")  # the poster's two strategies


@dataclasses.dataclass(frozen=True)
class Mode:
    """One mode's sizes. fig5: the poster's 32 requests of 1,500 + 1,024 tokens, scaled; fig4: batch 16.
    Figs 3, 5 and 6 run every strategy (swap-storage only at `storage_shares` when given); Figs 2 and 4 run
    `side_strategies` (quick: the poster's two)."""

    fig5: Workload
    shares: tuple[float, ...]            # Figs 3, 5 (and 6 at 12%, else the smallest)
    block_tokens: int                    # the default block size
    block_sizes: tuple[int, ...]         # Fig 2, at fig2_share
    fig2_share: float
    fig4_batch: int
    fig4_lengths: tuple[tuple[int, int], ...]  # (input, output) per point, at fig4_share
    fig4_share: float
    repeats: int = 3
    side_strategies: tuple[str, ...] = ALL
    storage_shares: tuple[float, ...] | None = None  # None: every share

    def fig5_strategies(self, share: float) -> tuple[str, ...]:
        return ALL if self.storage_shares is None or share in self.storage_shares else HOST


MODES = {
    "full": Mode(Workload(32, 192, 128), (0.12, 0.2, 0.3, 0.4, 0.5, 0.7), 16, (8, 16, 32, 64, 128), 0.3,
                 16, ((48, 32), (96, 64), (192, 128), (384, 256)), 0.3),
    # cut (`--cut`, full mode within kvtb study all's time budget): full's workloads, the shares on both sides
    # of the poster's 30-50%, three block sizes and three lengths, the poster's two strategies beside Fig. 5
    "cut": Mode(Workload(32, 192, 128), (0.12, 0.2, 0.3, 0.5, 0.7), 16, (8, 32, 128), 0.3,
                16, ((48, 32), (192, 128), (384, 256)), 0.3, side_strategies=HOST, storage_shares=(0.12, 0.3)),
    # quick: 4 points (the 12% and 30% shares, block 64, a shorter length) x 3 repeats, swap-storage at 12% only:
    # 39 batches and 11 compute node starts, about 12 minutes here
    "quick": Mode(Workload(16, 48, 24), (0.12, 0.3), 16, (16, 64), 0.3,
                  16, ((24, 12), (48, 24)), 0.3, side_strategies=HOST, storage_shares=(0.12,)),
    # smoke: one point (every strategy and the ample baselines), one repeat: its claims come out inconclusive
    "smoke": Mode(Workload(4, 16, 16), (0.5,), 8, (8,), 0.5, 4, ((16, 16),), 0.5, repeats=1),
}


# -- the plan --------------------------------------------------------------------------------------------

def planned(m: Mode) -> list[tuple[Workload, int, float, tuple[str, ...]]]:
    """Every (workload, block size, share, strategies) the sweeps need, in order, once."""
    out: dict[tuple[Workload, int, float], set[str]] = {}
    for s in m.shares:
        out.setdefault((m.fig5, m.block_tokens, s), set()).update(m.fig5_strategies(s))
    for b in m.block_sizes:
        out.setdefault((m.fig5, b, m.fig2_share), set()).update(m.side_strategies)
    for i, o in m.fig4_lengths:
        out.setdefault((Workload(m.fig4_batch, i, o), m.block_tokens, m.fig4_share), set()).update(m.side_strategies)
    return [(w, b, s, tuple(x for x in ALL if x in strategies)) for (w, b, s), strategies in out.items()]


def plan(m: Mode) -> list[tuple[Workload, int, float]]:
    """Every (workload, block size, share) the sweeps need, in order, once."""
    return [(w, b, s) for w, b, s, _ in planned(m)]


def count_runs(m: Mode) -> int:
    """Progress steps: one per batch, repeats included."""
    points = planned(m)
    baselines: dict[tuple[Workload, int], set[str]] = {}
    for w, b, _, strategies in points:
        baselines.setdefault((w, b), set()).update(STRATEGIES[s][1] for s in strategies)
    return m.repeats * (sum(len(s) for *_, s in points) + sum(len(p) for p in baselines.values()))


def sweep(points: Points, m: Mode) -> dict:
    res: dict[str, Any] = {"fig5": {}, "fig2": {}, "fig4": {}}
    for share in m.shares:
        res["fig5"][str(share)] = {s: points.point(m.fig5, m.block_tokens, share, s) for s in m.fig5_strategies(share)}
    for bt in m.block_sizes:
        res["fig2"][str(bt)] = {s: points.point(m.fig5, bt, m.fig2_share, s) for s in m.side_strategies}
    for i, o in m.fig4_lengths:
        w = Workload(m.fig4_batch, i, o)
        res["fig4"][str(i + o)] = {s: points.point(w, m.block_tokens, m.fig4_share, s) for s in m.side_strategies}
    res["ample"] = {f"{k[1].name} bt{k[2]}": trim_baseline(v) for k, v in points.done.items() if k[0] == "ample"}
    return res


# -- Fig. 6 and the ratios (pure) -------------------------------------------------------------------------

def fig6_key(f5: dict) -> str | None:
    """The share Fig. 6 is read at: the poster's 12% when it ran, else the smallest."""
    if not f5:
        return None
    near = [k for k in f5 if abs(float(k) - FIG6_SHARE) < 1e-9]
    return near[0] if near else min(f5, key=float)


def fig6(res: dict) -> dict:
    """Per strategy at Fig. 6's share: each repeat's pattern quantities (bench.study.poster_fig6)."""
    key = fig6_key(res.get("fig5", {}))
    if key is None:
        return {}
    factor = max(1, round(THROUGHPUT_BIN_S / POLL_S))
    out = {}
    for s, row in (res["fig5"][key] or {}).items():
        if not row:
            continue
        reps = []
        for r in row["repeats"]:
            tput, ample = ov.rebin(r["throughput"], factor), ov.rebin(r.get("ample_throughput") or [], factor)
            usage = f6.usage_per_event(r["samples"]) or {}
            reps.append({"usage_per_preemption": usage.get("per_preemption"),
                         "usage_per_admission": usage.get("per_admission"),
                         "extra_rises": f6.extra_rises(tput, ample),
                         "rises_with_admissions": f6.rises_with_admissions(tput, r["samples"], THROUGHPUT_BIN_S)})
        out[s] = {"share": row["actual_share"], "preemptions": row["preemption_count"], "repeats": reps}
    return out


def _tight(study: dict) -> tuple[str, dict]:
    f5 = study.get("results", {}).get("fig5", {})
    key = min(f5, key=float)
    return key, {s: r for s, r in (f5[key] or {}).items() if r}


def add_ratios(study: dict) -> None:
    if not study["results"].get("fig5"):
        return
    tight, by = _tight(study)
    r = study["ratios"]
    for s, row in by.items():
        r[f"extra_e2e_frac_{s}_at_{tight}"] = row["extra_e2e_frac"]
        r[f"extra_cpu_frac_{s}_at_{tight}"] = row["extra_cpu_frac"]
        r[f"engine_s_{s}_at_{tight}"] = row["engine_total_s"]
        r[f"reused_tokens_{s}_at_{tight}"] = row["reused_tokens"]
    rec, host = by.get("recompute"), by.get("swap-host")
    if rec and host:
        for name, key in (("extra_e2e", "extra_e2e_s"), ("extra_cpu", "extra_cpu_s"), ("engine_s", "engine_total_s")):
            if host[key] > 0:
                r[f"recompute_vs_swap_host_{name}_at_{tight}"] = rec[key] / host[key]
    if by.get("swap-storage") and host:
        r[f"swap_storage_out_s_at_{tight}"] = by["swap-storage"]["counters"]["preempt_swap_out_s"]
        r[f"swap_host_out_s_at_{tight}"] = host["counters"]["preempt_swap_out_s"]
        r[f"swap_storage_wait_s_at_{tight}"] = by["swap-storage"]["counters"]["preempt_swap_wait_s"]


def headline_rows(study: dict) -> list[dict]:
    """Rows of the README's headline table: {question, measured, target}."""
    target = ("the poster: swap below recompute when many tokens are evicted (Fig. 3) and for long sequences "
              "(Fig. 4), on its A100")
    if not study.get("results", {}).get("fig5"):
        failed = [f["error"] for f in study.get("failed", [])]
        return [{"question": "Preemption overhead at a tight pool: recompute / swap-host / swap-storage, extra e2e",
                 "measured": f"failed: {failed[0]}" if failed else "did not run", "target": target}]
    tight, by = _tight(study)
    w = next((r["workload"] for r in by.values()), "?")
    n = max((r.get("n_repeats", 1) for r in by.values()), default=0)

    def cells(fmt) -> str:
        return " / ".join(fmt(by[s]) if by.get(s) else "failed" for s in STRATEGIES)
    rows = [{"question": f"Preemption overhead, pool {float(tight):.0%} of what {w} need: recompute / swap-host / "
                         f"swap-storage, extra end to end (poster Fig. 5; mean of {n} repeats)",
             "measured": cells(lambda r: f"{r['extra_e2e_s']:+.1f} s ({r['extra_e2e_frac']:+.0%})"), "target": target},
            {"question": "The same, extra CPU time of the serving processes (it swings with the others' load too)",
             "measured": cells(lambda r: f"{r['extra_cpu_s']:+.1f} s ({r['extra_cpu_frac']:+.0%})"), "target": target},
            {"question": "The same, the engine's own time in preemption work (recompute of everything evicted, "
                         "prefix cache off; swap copies and waits)",
             "measured": cells(lambda r: f"{r['engine_total_s']:.2f} s"),
             "target": "the poster: recompute's compute vs swap's I/O"}]
    rec, host = by.get("recompute"), by.get("swap-host")
    if rec and host:
        e2e = host["extra_e2e_s"] - rec["extra_e2e_s"]
        eng = host["engine_total_s"] - rec["engine_total_s"]
        contradicts = (e2e > 0) != (eng > 0)
        rows.append({"question": "End to end against engine only: swap-host's overhead minus recompute's at the "
                                 f"same pool ({'they disagree in sign' if contradicts else 'same sign'})",
                     "measured": f"end to end {e2e:+.2f} s; engine only {eng:+.2f} s",
                     "target": "the poster: swap below recompute (negative) on its A100; the claims on it are "
                               "judged only under the polaris-a100 profile", "claim": "fig3_swap_lower"})
    return rows


# -- the command -----------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb study poster", description=__doc__.splitlines()[0])
    add_study_args(parser, "poster")
    parser.add_argument("--torch-threads", type=int, default=0, help="the compute node's torch threads (0: all)")
    parser.add_argument("--cut", action="store_true",
                        help="full mode's workloads at fewer points (shares 12-70%%, block sizes 8/32/128, three "
                             "lengths; swap-storage at 12%% and 30%% only): what kvtb study all runs when full mode "
                             "does not fit its --hours")
    parser.add_argument("--resume", action="store_true",
                        help="keep the points a stopped run finished (OUT/journal.json, same settings and D) and "
                             "run the rest: the study taken in sittings (bench/study/poster_journal.py)")
    args = parser.parse_args(argv)
    if args.cut and (args.quick or args.smoke):
        parser.error("--cut is a cut of full mode: give it without --quick or --smoke")
    args.profile_obj = check_profile(parser, args, "poster")
    args.command = shlex.join(["kvtb", "study", "poster", *argv])
    args.fingerprint = journals.fingerprint(
        mode_name(args), dataclasses.asdict(MODES[mode_name(args)]),
        args.profile_obj.name if args.profile_obj is not None else None, MODES[mode_name(args)].repeats,
        args.placement, args.torch_threads, PREFIX_CACHE == "true")
    args.journal = None
    if args.resume:
        try:
            args.journal = journals.load(args.out)
            if args.journal is not None:
                journals.check(args.journal, args.fingerprint, args.dilation_value)
        except journals.JournalError as exc:
            parser.error(f"--resume: {exc}")
    return args


def mode_name(args: argparse.Namespace) -> str:
    return "smoke" if args.smoke else "quick" if args.quick else "cut" if args.cut else "full"


def run(args: argparse.Namespace) -> tuple[dict, str, str, str]:
    from bench.stack import Stack, bench_config

    mode = mode_name(args)
    m = MODES[mode]
    study = new_study("poster", args, {"mode": dataclasses.asdict(m), "strategies": STRATEGIES, "poll_s": POLL_S,
                                       "torch_threads": args.torch_threads, "prefix_cache": False,
                                       "repeats": m.repeats, "seed": SEED})
    compute: dict[str, Any] = {"torch_threads": args.torch_threads, "block_tokens": m.block_tokens}
    smoke_model = None
    if args.smoke:
        from bench.study.paper import cached_tiny_model
        smoke_model = str(cached_tiny_model())
        compute["model_cache_dir"] = smoke_model
    config = bench_config(pool_tokens=4096, compute=compute)
    journal = args.journal
    dilation, how, warmup = 1.0, "", None
    if args.profile_obj is not None:  # before the stack starts: its services inherit the profile and D
        if journal is not None:  # a later sitting: the first one's D, so that every point is on one scale
            dilation, how, warmup = journal["dilation"], journal["dilation_chosen"], journal["warmup"]
        else:
            dilation, how, warmup = scaled.choose_dilation(args.profile_obj, args.dilation_value, bool(args.smoke),
                                                           args.torch_threads)  # at the compute node's threads
        scaled.apply(args.profile_obj.name, dilation)
        study["settings"]["profile"], study["settings"]["dilation"] = args.profile_obj.name, dilation
    if journal is None:
        journal = journals.new(args.fingerprint, dilation, how, warmup)
    sitting = journals.start_sitting(journal, study["machine"].get("git_commit"), study["machine"].get("time_utc"),
                                     args.command)
    journals.save(args.out, journal)
    progress = Progress(count_runs(m) - journals.batches(journal), "poster", enabled=not args.json)
    with Stack(services_dir(args, "poster"), config, policy="triggered", keep_data=args.keep_data,
               placement=args.placement) as stack, progress:
        runner = Runner(stack, smoke_model, progress, dilation)

        def note_sitting() -> None:  # this sitting's restarts and pacers so far, into the journal
            here = journal["sittings"][sitting]
            here["restarts_s"] = list(runner.restarts_s)
            if args.profile_obj is not None:
                here["pacing"] = runner.pacing_so_far() + scaled.stack_pacing(stack, compute=False)

        def on_done(key: tuple, value: dict) -> None:
            note_sitting()
            journals.keep(journal, key, value, sitting)
            journals.save(args.out, journal)

        try:
            points = Points(study, runner, progress, m.repeats, planned(m), journals.done(journal), on_done)
            study["results"] = sweep(points, m)
            note_sitting()
            journals.save(args.out, journal)
            study["results"]["compute_restarts_s"] = journals.restarts_s(journal)
            study["settings"]["sittings"] = journals.summary(journal)
            if args.profile_obj is not None:
                study["scale"] = scaled.record(args.profile_obj, dilation, journals.pacing(journal), how)
                study["scale"]["warmup"] = warmup
        finally:
            runner.close()
            if args.profile_obj is not None:
                scaled.clear()
    study["results"]["fig6"] = fig6(study["results"])
    judge(study, CLAIMS)
    add_ratios(study)
    study["plots"] = make_plots(study["results"], Path(args.out), virtual=args.profile_obj is not None,
                                fig6_share=FIG6_SHARE)
    body = "\n\n".join(t for t in (sittings_note(study), storage_note(study), rows_table(study)) if t)
    title = "The recompute-vs-swap poster, Figs 2-6"
    if args.profile_obj is not None:
        title += f", under the hardware profile `{args.profile_obj.name}` (virtual time)"
        body = scaled_note(study, args.profile_obj) + "\n\n" + body
    return study, title, intro_text(m, mode), body


main = main_of(parse_args, run)
