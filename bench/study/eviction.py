"""`kvtb study eviction`: the agent's eviction and admission policies on a conversation trace, against Belady.

A conversation trace (synthetic, drawn from the Mooncake FAST'25 conversation trace's distributions:
bench.conversation_trace; or a real Mooncake JSONL file with --trace) is replayed, in simulated
time, through the agent's own classes (smartnic.requester, smartnic.eviction, smartnic.admission,
driven by bench.cache_replay as smartnic.agent drives them) at several capacities, given as
fractions of the trace's working set (every block it stores):

- `lru`: LRU by capacity, high watermark = the capacity, low = --low-watermark of it;
- `timer`: the idle timer alone, its TTL the longest whose stored blocks never exceed the
  capacity (a timer has no capacity of its own: sized so, it stays in the same budget);
- `both`: LRU by capacity and the timer, its TTL fixed (--ttl-s; default the 90th percentile of the
  trace's reuse gaps: a context idle longer is rarely asked for again);
- `on_reuse`: LRU by capacity, admission on_reuse (a block is stored on its second sighting);
- Belady's bound (MIN with bypass, offline) and the ideal (unbounded capacity).

The hit rate is the share of looked-up prompt blocks (full blocks, at most input - 1 tokens, as
the agent's lookup) served from storage. Then one capacity is replayed through the real services
(bench.stack: storage node, agent, compute node; the real model, a tiny one with --smoke) under
`lru` and `on_reuse` (--quick: `lru`), three times each, each in a fresh stack (bench.study.eviction_real),
on a small trace of the same distributions with think times compressed (the requests go back to back:
neither policy reads the clock), and each repeat's real hit rate is set beside the replay's at the
capacity the agent really had (its watermarks over the stored block's bytes).

The claims (bench.study.eviction_claims) quote the paper's one sentence on eviction (Sec. III-B) and
judge it on the real check's repeats; the replay's rows (Mooncake's figures, admission, Belady) are our
readings of references, labelled so, and are computed (a replay of a seeded trace is deterministic).
"""
from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path

from bench import cache_replay as cr
from bench import conversation_trace as ct
from bench.progress import Progress
from bench.results import plot_lines, progress_for
from bench.study.eviction_claims import CLAIMS, SEED, TOLERANCE
from bench.study.eviction_real import (
    REAL_MAX_OUTPUT,
    REAL_SESSION_SCALE,
    REAL_THINK_SCALE,
    REAL_WINDOW,
    scaled_real_part,
)
from bench.study.report import add_study_args, check_profile, judge, main_of, new_study, run_part

logger = logging.getLogger(__name__)

NAME = "eviction"
CAPACITIES = {"full": (0.02, 0.05, 0.1, 0.25, 0.4, 0.5, 0.75, 1.0),
              "quick": (0.02, 0.05, 0.1, 0.25, 0.5, 1.0), "smoke": (0.1, 0.25, 1.0)}
REQUESTS = {"full": 3000, "quick": 1500, "smoke": 200}
REAL_REQUESTS = {"full": 60, "quick": 25, "smoke": 6}  # smoke: the tiny model, one stack (25 s here;
# when other work keeps the 2 cores busy, making the tiny model and starting the stack take a minute)
REAL_REPEATS = {"full": 3, "quick": 3, "smoke": 1}  # the real check's verdict needs 3 (smoke: inconclusive)
# a real request takes ~6 s here and a stack ~30 s: quick 3 x (25 x 6 + 30) s + the replay's 5 s, about
# 9 min; full 2 policies x 3 x (60 x 6 + 30) s + 15 s, about 40 min (bench.study.all_budget)
REAL_POLICIES = ("lru", "on_reuse")
MODE_REAL_POLICIES = {"full": REAL_POLICIES, "quick": ("lru",), "smoke": ("lru",)}  # quick: time
HEADLINE_FRACTION = 0.25
LOW_WATERMARK = 0.9
# Mooncake FAST'25 (paper §5.3.1, Fig. 9): a local cache of 3M tokens, a global one of 50M; the
# released conversation trace has 93,588,480 distinct input tokens (182,790 ids x 512), measured here
MOONCAKE_DISTINCT_TOKENS = 93_588_480
MOONCAKE_LOCAL_TOKENS, MOONCAKE_GLOBAL_TOKENS = 3_000_000, 50_000_000
POLICY_LABELS = {"lru": "LRU", "timer": "timer", "both": "both", "on_reuse": "on_reuse (LRU)"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb study eviction", description=__doc__.splitlines()[0])
    add_study_args(parser, NAME)
    parser.add_argument("--trace", type=Path, help="a Mooncake-format JSONL trace (512-token blocks) instead "
                                                   "of the synthetic one")
    parser.add_argument("--requests", type=int, help="requests of the trace (default 3000; --quick 1500; "
                                                     "--smoke 200; with --trace: its first N, 0 = all)")
    parser.add_argument("--capacities", type=float, nargs="+",
                        help="capacities as fractions of the working set")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--low-watermark", type=float, default=LOW_WATERMARK,
                        help="LRU's low watermark as a fraction of the capacity (default 0.9)")
    parser.add_argument("--ttl-s", type=float, default=0.0,
                        help="`both`'s TTL in trace seconds (default: the 90th percentile of the reuse gaps)")
    parser.add_argument("--real-capacity", type=float, default=HEADLINE_FRACTION,
                        help="the capacity (fraction) replayed through the real services (default 0.25)")
    parser.add_argument("--real-requests", type=int, help="requests of the real check (default 60; "
                                                          "--quick 25; --smoke 6; 0 skips it)")
    parser.add_argument("--real-repeats", type=int, help="repeats of the real check, each in a fresh stack "
                                                         "(default 3; --smoke 1)")
    parser.add_argument("--real-policies", nargs="+", choices=REAL_POLICIES,
                        help="policies of the real check (default lru and on_reuse; --quick lru)")
    parser.add_argument("--source-block-tokens", type=int, default=512, help="the --trace file's block size")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    args.mode = mode
    if args.requests is None:
        args.requests = 0 if args.trace else REQUESTS[mode]
    if args.real_requests is None:
        args.real_requests = REAL_REQUESTS[mode]
    if args.real_repeats is None:
        args.real_repeats = REAL_REPEATS[mode]
    if args.real_repeats < 1 or args.real_requests < 0:
        parser.error("--real-repeats must be at least 1 and --real-requests not negative")
    args.real_policies = list(args.real_policies or MODE_REAL_POLICIES[mode])
    args.capacities = sorted(set(args.capacities or CAPACITIES[mode]))
    if any(not 0 < c <= 1 for c in args.capacities) or not 0 < args.real_capacity <= 1:
        parser.error("capacities are fractions of the working set, in (0, 1]")
    if not 0 < args.low_watermark <= 1:
        parser.error("--low-watermark is a fraction in (0, 1]")
    args.profile_obj = check_profile(parser, args, NAME)
    args.pacing = []
    return args


def block_tokens() -> int:
    from compute_node.settings import ComputeSettings
    return ComputeSettings().block_tokens


# -- the trace ---------------------------------------------------------------------------------------

def load_turns(args, bt: int) -> list[ct.Turn]:
    if args.trace:
        return ct.load_mooncake(args.trace, bt, args.source_block_tokens, args.requests)
    return ct.synthetic_conversations(args.requests, args.seed, bt)


def trace_part(study: dict, args, bt: int) -> dict:
    turns = load_turns(args, bt)
    accesses = cr.accesses_of([t.request for t in turns], bt, [t.context for t in turns])
    summary = ct.summary(turns, bt)
    summary["working_set_blocks"] = cr.working_set(accesses)
    summary["source"] = str(args.trace) if args.trace else "synthetic (bench.conversation_trace)"
    gaps = cr.reuse_gaps(accesses)
    summary["reuse_gap_p50_s"] = cr.percentile(gaps, 0.5)
    summary["reuse_gap_p90_s"] = cr.percentile(gaps, 0.9)
    if not args.trace and args.mode != "smoke":  # the whole hour, as the paper's Table 2 counts it
        whole = ct.synthetic_conversations(12031, args.seed, ct.MOONCAKE_BLOCK_TOKENS)
        summary["full_hour"] = ct.summary(whole, ct.MOONCAKE_BLOCK_TOKENS)
    study["results"]["trace"] = summary
    return {"turns": turns, "accesses": accesses}


# -- the replays -------------------------------------------------------------------------------------

def replay_part(study: dict, args, accesses: list[cr.Access], progress: Progress) -> dict:
    """Every policy and Belady at every capacity; the ideal; Mooncake's local and global cache sizes."""
    r = study["results"]
    ws = r["trace"]["working_set_blocks"]
    ttl_both = args.ttl_s or r["trace"]["reuse_gap_p90_s"] or 1.0
    r["ttl_both_s"] = ttl_both
    r["headline_fraction"] = headline_fraction(study)
    r["ideal"] = cr.ideal(accesses).to_json()
    curves: dict[str, dict[str, dict]] = {p: {} for p in (*cr.POLICIES, "belady")}
    for f in args.capacities:
        cap = max(1, round(f * ws))
        low = cr.low_of(cap, args.low_watermark)
        key = f"{f:g}"
        curves["lru"][key] = cr.replay(accesses, "lru", cap, low_blocks=low).to_json()
        progress.update()
        ttl = cr.timer_ttl_for(accesses, cap)
        curves["timer"][key] = cr.replay(accesses, "timer", cap, ttl_s=ttl).to_json()
        progress.update()
        curves["both"][key] = cr.replay(accesses, "both", cap, low_blocks=low, ttl_s=ttl_both).to_json()
        progress.update()
        curves["on_reuse"][key] = cr.replay(accesses, "on_reuse", cap, low_blocks=low).to_json()
        progress.update()
        curves["belady"][key] = cr.belady(accesses, cap).to_json()
        progress.update()
    r["curves"] = curves
    lookup_blocks = len({k for a in accesses for k in a.looked_up})
    mooncake = {}
    for name, tokens in (("local_3M", MOONCAKE_LOCAL_TOKENS), ("global_50M", MOONCAKE_GLOBAL_TOKENS)):
        cap = max(1, round(tokens / MOONCAKE_DISTINCT_TOKENS * lookup_blocks))
        lru = cr.replay(accesses, "lru", cap, low_blocks=cr.low_of(cap, args.low_watermark))
        mooncake[name] = {"capacity_blocks": cap, "fraction_of_working_set": cap / ws, **lru.to_json()}
    r["mooncake_capacities"] = mooncake
    return curves


# -- claims, ratios, the page ------------------------------------------------------------------------

def _at(curves: dict, policy: str, f: float) -> float | None:
    point = curves.get(policy, {}).get(f"{f:g}")
    return point["hit_rate"] if point else None


def headline_fraction(study: dict) -> float | None:
    fr = study.get("settings", {}).get("capacities") or []
    if not fr:
        return None
    return min(fr, key=lambda f: abs(f - HEADLINE_FRACTION))


def add_ratios(study: dict) -> None:
    r, ratios = study["results"], study["ratios"]
    curves = r.get("curves")
    if curves:
        ratios["ideal_hit_rate"] = r["ideal"]["hit_rate"]
        for f in study["settings"]["capacities"]:
            b = _at(curves, "belady", f)
            for p in cr.POLICIES:
                v = _at(curves, p, f)
                ratios[f"hit_rate_{p}_at_{f:g}"] = v
            lru = _at(curves, "lru", f)
            ratios[f"hit_rate_belady_at_{f:g}"] = b
            ratios[f"lru_vs_belady_at_{f:g}"] = lru / b if b else None
        f = headline_fraction(study)
        lru, onr = curves["lru"][f"{f:g}"], curves["on_reuse"][f"{f:g}"]
        ratios[f"on_reuse_puts_saved_at_{f:g}"] = 1 - onr["puts"] / lru["puts"] if lru["puts"] else None
    for policy, runs in (r.get("real") or {}).get("runs", {}).items():
        pairs = [(run["hit_rate"], run["simulated"]["hit_rate"]) for run in runs]
        if pairs and all(sim for _, sim in pairs):  # the mean over the repeats
            ratios[f"real_vs_simulated_hit_rate_{policy}"] = statistics.fmean(real / sim for real, sim in pairs)
    study["ratios"] = {k: v for k, v in ratios.items() if v is not None}


def headline_rows(study: dict) -> list[dict]:
    """The README's rows: hit rates at about 25 % of the working set; the real agent against its replay."""
    curves = study.get("results", {}).get("curves")
    f = headline_fraction(study)
    question = "Prompt-block hit rate at {} of the working set: LRU / timer / both / on_reuse / Belady"
    rows = []
    if curves and f is not None:
        point = {p: curves[p][f"{f:g}"]["hit_rate"] for p in curves}
        rows.append({"question": question.format(f"{f:g}"),
                     "measured": " / ".join(f"{point[p]:.3f}" for p in (*cr.POLICIES, "belady")),
                     "target": f"Belady's bound ({point['belady']:.3f})", "claim": "belady_bound"})
    else:
        err = next((x["error"] for x in study.get("failed", []) if x["part"] in ("trace", "replay")), "")
        rows.append({"question": question.format("25 %"), "target": "Belady's bound",
                     "measured": f"failed: {err}" if err else "not measured"})
    runs = (study.get("results", {}).get("real") or {}).get("runs") or {}
    runs = runs.get("lru") or next((r for r in runs.values() if r), [])
    if runs:
        real = statistics.fmean(run["hit_rate"] for run in runs)
        sim = statistics.fmean(run["simulated"]["hit_rate"] for run in runs)
        rows.append({"question": f"Real agent vs its replay ({runs[0]['policy']}, "
                                 f"{runs[0]['capacity_blocks']} blocks, mean of {len(runs)} repeat{'s' * (len(runs) != 1)})",
                     "measured": f"{real:.3f} vs {sim:.3f}",
                     "target": f"equal within {TOLERANCE} (the paper's Sec. III-B: LRU on the NIC's CPU)",
                     "claim": "sec3b_lru_on_the_nic_cpu"})
    return rows


def plot(study: dict, out: Path) -> Path | None:
    curves = study["results"].get("curves")
    if not curves:
        return None
    xs = study["settings"]["capacities"]
    series = {POLICY_LABELS[p]: (xs, [_at(curves, p, x) for x in xs]) for p in cr.POLICIES}
    series["Belady's bound"] = (xs, [_at(curves, "belady", x) for x in xs])
    return plot_lines(out / "eviction_hit_rate.png", series,
                      title="Prompt-block hit rate against storage capacity",
                      xlabel="capacity / working set (every block the trace stores)", ylabel="hit rate",
                      logx=True, hlines={"ideal (unbounded)": study["results"]["ideal"]["hit_rate"]})


def _trace_text(study: dict) -> list[str]:
    t, s = study["results"]["trace"], study["settings"]
    lines = ["## The trace", "",
             f"{t['source']}: {t['requests']} requests, {t['sessions']} sessions, {t['follow_ups']} "
             f"follow-ups, {t['span_s']:.0f} s; input mean {t['mean_input_tokens']:.0f} / median "
             f"{t['median_input_tokens']} / max {t['max_input_tokens']} tokens, output mean "
             f"{t['mean_output_tokens']:.1f}; working set {t['working_set_blocks']} blocks of "
             f"{s['block_tokens']} tokens; reuse gap p50 {t['reuse_gap_p50_s']:.0f} s, p90 "
             f"{t['reuse_gap_p90_s']:.0f} s.", ""]
    return lines + ([SYNTHETIC_NOTE, ""] if not s.get("trace") else [])


def _curves_text(study: dict) -> list[str]:
    r, s = study["results"], study["settings"]
    curves = r["curves"]
    lines = ["## Hit rate by capacity", "",
             f"Ideal (unbounded): {r['ideal']['hit_rate']:.3f}; `both`'s TTL {r['ttl_both_s']:.0f} s; LRU's "
             f"low watermark {s['low_watermark']:g} of the capacity; the timer's pass every "
             f"{s['timer_pass_s']:g} s of trace time.", "",
             "| capacity | blocks | LRU | timer (TTL s) | both | on_reuse | Belady | PUTs LRU / on_reuse |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in s["capacities"]:
        c = {p: curves[p][f"{f:g}"] for p in curves}
        lines.append(f"| {f:g} | {c['lru']['capacity_blocks']} | {c['lru']['hit_rate']:.3f} | "
                     f"{c['timer']['hit_rate']:.3f} ({c['timer']['ttl_s']:.0f}) | "
                     f"{c['both']['hit_rate']:.3f} | "
                     f"{c['on_reuse']['hit_rate']:.3f} | {c['belady']['hit_rate']:.3f} | "
                     f"{c['lru']['puts']} / {c['on_reuse']['puts']} |")
    return lines + [""]


def _real_text(real: dict) -> list[str]:
    t = real["trace"]
    lines = ["## The real services at one capacity", "",
             f"{t['requests']} requests of the same distributions ({t['follow_ups']} follow-ups), think "
             f"times x{real['think_scale']:g} and session starts x{real['session_rate_scale']:g}, requests "
             f"cut to {real['window']} tokens and replies to {real['max_output']}, sent back to back (time "
             f"compressed: LRU and admission never read the clock); capacity {real['fraction']:g} of its "
             f"working set of {real['working_set_blocks']} blocks; ideal {real['ideal_hit_rate']:.3f}. A "
             "prompt's tokens are drawn per block id, so equal ids are equal blocks for the agent's hash "
             "chain; the replay runs at the capacity the agent had (its watermarks over the stored block's "
             "bytes).", "",
             "| policy | repeat | blocks (high / low) | real hit rate | replayed | requests differing | PUTs "
             "real / replayed | skipped real / replayed | evictions |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p, runs in real["runs"].items():
        for run in runs:
            sim = run["simulated"]
            lines.append(f"| {p} | {run['repeat']} | {run['capacity_blocks']} / {run['low_blocks']} | "
                         f"{run['hit_rate']:.3f} | {sim['hit_rate']:.3f} | {run['requests_differing']} | "
                         f"{run['puts']} / {sim['puts']} | {run['puts_skipped']} / {sim['puts_skipped']} | "
                         f"{run['evictions']} |")
    return lines + [""]


def body(study: dict) -> str:
    r = study["results"]
    lines = _trace_text(study) if r.get("trace") else []
    lines += _curves_text(study) if r.get("curves") else []
    lines += _real_text(r["real"]) if r.get("real") else []
    return "\n".join(lines)


SYNTHETIC_NOTE = (
    "The trace is **synthetic**: sessions drawn from the Mooncake FAST'25 conversation trace's "
    "distributions (bench.conversation_trace). The paper publishes its means (Table 2: 12,031 requests "
    "in an hour, input 12,035 and output 343 tokens on average, 40 % cache ratio, 512-token blocks); the "
    "shapes were measured on the released file (kvcache-ai/Mooncake "
    "FAST25-release/traces/conversation_trace.jsonl), sessions inferred from shared prefixes: sessions "
    "start at 2.08/s (Poisson); turns per session from the file's histogram (69 % one turn, mean 1.63); "
    "first input lognormal (mu 8.51, sigma 1.27 in ln tokens); a follow-up's input is the previous input, "
    "reply and a new message (1 / 7 / 23 / 425 / 4,267 / 17,091 tokens at the 10 / 25 / 50 / 75 / 90 / "
    "99th percentiles); replies by the file's percentiles (24 / 156 / 350 / 472 / 597 / 1,120, max 2,000); "
    "think time lognormal (mu 4.88, sigma 0.98 in ln s: median 131 s); block 0 shared by every request, a "
    "follow-up repeating its previous input's full blocks. Lengths are scaled by 1/16 (512-token blocks to "
    "the testbed's 32, the 128k window to this model's 8,192), so each request keeps its number of blocks. "
    "`--trace FILE` replays a real Mooncake JSONL file instead.")


def settings_of(args) -> dict:
    real_check = "run" if args.real_requests else "skipped (--real-requests 0)"
    model = ("tiny random Llama (smoke: the real check's hit rates are the agent's, not the model's)"
             if args.smoke else "SmolLM2-135M")
    return {"trace": str(args.trace) if args.trace else None, "requests": args.requests,
            "capacities": args.capacities, "seed": args.seed, "low_watermark": args.low_watermark,
            "ttl_s": args.ttl_s or None, "real_capacity": args.real_capacity,
            "real_requests": args.real_requests, "real_policies": args.real_policies,
            "real_repeats": args.real_repeats,
            "real_check": real_check, "block_tokens": block_tokens(), "timer_pass_s": cr.PASS_S,
            "real_window": REAL_WINDOW, "real_max_output": REAL_MAX_OUTPUT,
            "real_think_scale": REAL_THINK_SCALE, "real_session_rate_scale": REAL_SESSION_SCALE,
            "tolerance": TOLERANCE, "model": model, "smoke": args.smoke}


def run(args: argparse.Namespace) -> tuple[dict, str, str, str]:
    study = new_study(NAME, args, settings_of(args))
    bt = study["settings"]["block_tokens"]
    steps = 5 * len(args.capacities) + args.real_requests * len(args.real_policies) * args.real_repeats
    with progress_for(args, steps, NAME) as progress:
        made = run_part(study, "trace", lambda: trace_part(study, args, bt))
        if made:
            run_part(study, "replay", lambda: replay_part(study, args, made["accesses"], progress))
        if args.real_requests:
            run_part(study, "real", lambda: scaled_real_part(study, args, bt, progress))
        else:
            study["results"]["real_check"] = study["settings"]["real_check"]
    add_ratios(study)
    judge(study, CLAIMS)
    study["plots"] = [plot(study, Path(args.out))]
    intro = __doc__.split("\n", 2)[2].strip()
    title = "Eviction and admission on a conversation trace, against Belady's bound"
    if args.profile_obj is not None:
        title += f", under the hardware profile `{args.profile_obj.name}`"
        intro = (f"Under the hardware profile `{args.profile_obj.name}`, the real part's services pace every "
                 "modeled operation at D and the agent's idle timer counts virtual seconds; its figures are "
                 "counts (blocks restored, stored, evicted), which a profile does not change unless an "
                 "operation's order does. The trace and its replays are counts alone and run as they do "
                 "without a profile.\n\n" + intro)
    return study, title, intro, body(study)


main = main_of(parse_args, run)

__all__ = ["CLAIMS", "SEED", "headline_rows", "main", "parse_args", "run"]
