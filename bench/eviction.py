"""`kvtb bench eviction`: returning users against a storage capacity below the working set.

A population of users, each with one conversation, returns in a Zipf-distributed order
(seeded, the same for every run) with exponential think times between visits; a visit is one
turn through the agent under `triggered`. The agent's capacity (capacity_high_bytes, low at
80 % of it) is set to a fraction of the working set (every user's final context in bytes);
the timer's ttl_s is that fraction of the mean time between one user's visits (timed). Per eviction
policy (lru, timer, both) and fraction: the hit rate of follow-ups (KV restored from storage)
and their mean TTFT. Each (policy, fraction) runs on a fresh set of services. Time is
compressed: small contexts, short replies, think times of a fraction of a second.
"""
from __future__ import annotations

import argparse
import logging
import random
import time
from pathlib import Path


from bench.results import (
    add_common_args,
    format_table,
    new_result,
    plot_lines,
    plots,
    progress_for,
    ratios_text,
    run_bench,
    run_part,
    services_dir,
)
from bench.stack import Stack, bench_config
from bench.stats import hit_rate, mean, ratio
from bench.turns import context_prompt, encode, follow_up_ids, generate
from kvtb_proto import compute_pb2

logger = logging.getLogger(__name__)

POLICIES = ("lru", "timer", "both")
FRACTIONS = (0.25, 0.5, 1.0)
MESSAGE = "And then? One word."
LOW_WATERMARK = 0.8


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench eviction", description=__doc__.splitlines()[0])
    add_common_args(parser, "eviction")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, help=f"eviction policies {POLICIES}")
    parser.add_argument("--fractions", type=float, nargs="+", help=f"capacity / working set {FRACTIONS}")
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--visits", type=int, default=30)
    parser.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent of user popularity")
    parser.add_argument("--think-s", type=float, default=0.2, help="mean think time between visits")
    parser.add_argument("--context-tokens", type=int, default=128, help="each user's first message")
    parser.add_argument("--max-new-tokens", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    args.fractions = args.fractions or ([0.5] if args.smoke else list(FRACTIONS))
    args.policies = args.policies or (["both"] if args.smoke else list(POLICIES))
    if args.smoke:
        args.users, args.visits, args.context_tokens, args.think_s = 3, 5, 64, 0.05
    return args


def zipf_schedule(users: int, visits: int, s: float, seed: int) -> list[int]:
    """Which user returns at each of `visits` visits: Zipf(s)-distributed (weights 1/k^s), seeded."""
    return random.Random(seed).choices(range(users), weights=[1.0 / k ** s for k in range(1, users + 1)],
                                       k=visits)


def think_times(count: int, mean_s: float, seed: int) -> list[float]:
    """Exponential think times with the given mean, seeded."""
    rng = random.Random(seed)
    return [rng.expovariate(1.0 / mean_s) if mean_s > 0 else 0.0 for _ in range(count)]


def working_set_bytes(schedule: list[int], first_tokens: int, per_turn_tokens: int,
                      kv_bytes_per_token: int) -> int:
    """Every visiting user's final context in KV bytes."""
    visits = {u: schedule.count(u) for u in set(schedule)}
    return sum((first_tokens + n * per_turn_tokens) * kv_bytes_per_token for n in visits.values())


def mean_gap(schedule: list[int]) -> float:
    """Mean number of visits between a user's consecutive visits (1.0 with no returns)."""
    last: dict[int, int] = {}
    gaps = []
    for i, user in enumerate(schedule):
        if user in last:
            gaps.append(i - last[user])
        last[user] = i
    return mean(gaps) if gaps else 1.0


def plan(stub, args) -> dict:
    """The visit order, think times, the working set and the mean revisit time (a visit timed here)."""
    info = stub.Info(compute_pb2.InfoRequest(), timeout=30)
    schedule = zipf_schedule(args.users, args.visits, args.zipf_s, args.seed)
    prompt = context_prompt(stub, args.context_tokens)
    first = generate(stub, "u0", "plan", prompt, args.max_new_tokens)
    follow = generate(stub, "u0", "plan", follow_up_ids(stub, prompt, first, MESSAGE), args.max_new_tokens)
    per_turn = len(encode(stub, MESSAGE, True, True)) + args.max_new_tokens
    ws = working_set_bytes(schedule, len(prompt) + args.max_new_tokens, per_turn, info.kv_bytes_per_token)
    return {"schedule": schedule, "think_s": think_times(args.visits, args.think_s, args.seed),
            "prompt": prompt, "working_set_bytes": ws, "visit_s": follow.e2e_s,
            "mean_revisit_s": mean_gap(schedule) * (args.think_s + follow.e2e_s)}


def agent_settings(policy: str, fraction: float, p: dict) -> dict:
    high = int(fraction * p["working_set_bytes"])
    ttl = max(fraction * p["mean_revisit_s"], 0.05)
    return {"eviction_policy": policy, "capacity_high_bytes": high,
            "capacity_low_bytes": int(LOW_WATERMARK * high), "ttl_s": ttl, "eviction_interval_s": 0.05}


def visit_all(stub, p: dict, max_new: int, progress) -> dict:
    """Every visit in order; follow-ups' hits and TTFTs."""
    history: dict[int, list[int]] = {}
    last: dict[int, object] = {}
    hits, ttft_hit, ttft_miss = 0, [], []
    for user, think in zip(p["schedule"], p["think_s"]):
        time.sleep(think)
        ids = p["prompt"] if user not in history else follow_up_ids(stub, history[user], last[user], MESSAGE)
        turn = generate(stub, f"u{user}", f"ctx-{user}", ids, max_new)
        if user in history:
            restored = turn.record.kv_source == "restored"
            hits += restored
            (ttft_hit if restored else ttft_miss).append(turn.ttft_s)
        history[user], last[user] = ids, turn
        progress.update()
    follow = len(ttft_hit) + len(ttft_miss)
    return {"follow_ups": follow, "hits": hits, "hit_rate": hit_rate(hits, follow),
            "ttft_mean_s": mean(ttft_hit + ttft_miss) if follow else 0.0,
            "ttft_hit_mean_s": mean(ttft_hit) if ttft_hit else None,
            "ttft_miss_mean_s": mean(ttft_miss) if ttft_miss else None}


def make_plan(args) -> dict:
    """Start the services once to learn the model's sizes and the prompt's tokens; plan the run."""
    with Stack(services_dir(args, "eviction-plan"), bench_config(users=1), keep_data=args.keep_data) as stack:
        with stack.agent_channel() as channel:
            return plan(stack.compute_stub(channel), args)


def run_config(args, policy: str, fraction: float, p: dict, progress) -> dict:
    """One (policy, fraction) on fresh services."""
    settings = agent_settings(policy, fraction, p)
    config = bench_config(pool_tokens=4096, max_context_tokens=1024, users=1, smartnic=settings)
    label = f"eviction-{policy}-{fraction}"
    with Stack(services_dir(args, label), config, keep_data=args.keep_data) as stack:
        with stack.agent_channel() as channel:
            generate(stack.compute_stub(channel), "warm-up", "warm-up", p["prompt"][:16], 2, "recompute")
            figures = visit_all(stack.compute_stub(channel), p, args.max_new_tokens, progress)
        figures["evictions_by_reason"] = dict(stack.agent_stats().evictions_by_reason)
    figures["agent"] = settings
    return figures


def add_ratios(result: dict) -> None:
    """Hit rate per policy and fraction; each policy's smallest fraction against the full capacity."""
    for key, f in result["results"]["runs"].items():
        result["ratios"][f"hit_rate_{key}"] = f["hit_rate"]
    fr = result["settings"]["fractions"]
    for policy in result["settings"]["policies"]:
        lo, hi = (result["results"]["runs"].get(f"{policy}_{x}") for x in (min(fr), max(fr)))
        if lo and hi and len(fr) > 1 and lo["follow_ups"]:
            key = f"ttft_{policy}_{min(fr)}_vs_{max(fr)}"
            result["ratios"][key] = ratio(lo["ttft_mean_s"], hi["ttft_mean_s"])


def table(result: dict) -> str:
    rows = []
    for key, f in result["results"]["runs"].items():
        policy, fraction = key.rsplit("_", 1)
        evictions = ", ".join(f"{k} {v}" for k, v in sorted(f["evictions_by_reason"].items())) or "-"
        rows.append([policy, fraction, f["follow_ups"], f"{f['hit_rate']:.2f}",
                     f"{f['ttft_mean_s'] * 1e3:.1f}", f"{f['agent']['capacity_high_bytes'] / 1e6:.1f}",
                     f"{f['agent']['ttl_s']:.2f}", evictions])
    for f in result.get("failed") or []:
        policy, fraction = f["part"].rsplit("_", 1) if "_" in f["part"] else (f["part"], "")
        rows.append([policy, fraction, f"failed: {f['error'].splitlines()[0][:160]}", "", "", "", "", ""])
    head = ["policy", "capacity", "follow-ups", "hit rate", "TTFT ms", "high MB", "ttl s", "evictions"]
    r = result["results"]
    return (f"{result['settings']['users']} users, {result['settings']['visits']} visits (Zipf "
            f"s={result['settings']['zipf_s']}), working set {r['working_set_bytes'] / 1e6:.1f} MB\n"
            f"{format_table(head, rows)}\n\n{ratios_text(result['ratios'])}")


def plot(result: dict, out) -> Path | None:
    series = {}
    for policy in result["settings"]["policies"]:
        xs = [x for x in result["settings"]["fractions"] if f"{policy}_{x}" in result["results"]["runs"]]
        runs = result["results"]["runs"]
        series[f"{policy} hit rate"] = (xs, [runs[f"{policy}_{x}"]["hit_rate"] for x in xs])
    return plot_lines(out / "eviction.png", series, title="Follow-up restore hit rate against capacity",
                      xlabel="capacity / working set (ttl: same fraction of the revisit time)",
                      ylabel="hit rate")


def run(args: argparse.Namespace) -> dict:
    settings = {k: getattr(args, k) for k in ("policies", "fractions", "users", "visits", "zipf_s", "think_s",
                                              "context_tokens", "max_new_tokens", "seed", "smoke")}
    result = new_result("eviction", settings)
    p = make_plan(args)
    result["results"] = {"working_set_bytes": p["working_set_bytes"], "mean_revisit_s": p["mean_revisit_s"],
                         "schedule": p["schedule"], "runs": {}}
    total = len(args.policies) * len(args.fractions) * args.visits
    with progress_for(args, total, "eviction") as progress:
        for fraction in args.fractions:
            for policy in args.policies:  # a run that fails is in result["failed"], the others still run
                figures = run_part(result, f"{policy}_{fraction}",
                                   lambda: run_config(args, policy, fraction, p, progress))
                if figures is not None:
                    result["results"]["runs"][f"{policy}_{fraction}"] = figures
    add_ratios(result)
    result["plots"] = plots(plot(result, args.out))
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
