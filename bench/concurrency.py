"""`kvtb bench concurrency`: 1 to 32 concurrent multi-turn chat sessions through the frontend (ScaleLLM's Table 1).

Every service runs as a process (`kvtb up`'s wiring) under `triggered`: the compute node batches
every session's turns continuously over its paged pool, and each turn's KV leaves for storage,
so follow-ups restore it. First each distinct conversation runs alone (the reference); then, per
level, that many sessions start together and work through a queue of conversations, each
conversation a new user's, its turns back to back, a session taking the next conversation as soon
as its last one ended (ScaleLLM sends 20 requests per concurrent one, AIPerf likewise keeps its
concurrency busy). Every level's queue holds the same mix of the distinct conversations, at least
--conversations-per-session per session: one session runs each once, one after the other. Per
level: TTFT and TBT (mean, p50, p99, from the frontend's turn summaries), output tokens per second,
gateway and engine time, the share of follow-ups restored, preemptions, and the share of replies
identical to the same conversation alone (greedy; batched float math may differ from batch 1 in
the last bits, so this is reported, not required). A level whose run raised or whose
conversations failed is reported failed (in `failed` and its row), never left out silently.

Each CPU placement of `--placements` (default `shared nic` on 2 CPUs or more: bench.placements)
gets a stack of its own in the same run, started in it, and the whole measurement (reference and
levels); the result keeps the first placement's figures under the usual keys, every placement's
in `results.by_placement` and as `<ratio>@<placement>`, and compares tokens/s at each level (and
at the most sessions / one) as `<figure>@nic_vs_shared`.

`--kv-dtypes float32 bfloat16` runs all of that once per KV pool dtype (compute.kv_dtype), in the same
run, one after the other: the first dtype's figures under the usual keys, each dtype's whole result
in `results.by_kv_dtype`, its ratios as `<ratio>@<dtype>`, and each later dtype's key figures against
the first's as `<figure>@<placement>@<dtype>_vs_<first>` (issue 45: a narrower pool's default must
not cost throughput).
"""
from __future__ import annotations

import argparse
import collections
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bench import sessions
from bench.results import (
    add_common_args,
    fail,
    failure_of,
    finish,
    floors,
    format_table,
    new_result,
    plot_lines,
    plots,
    progress_for,
    ratios_text,
    services_dir,
    setup_logging,
    stop_on_sigterm,
)
from bench.placements import add_placements_arg, chosen, run_placements, tables
from bench.stack import Stack, bench_config, bench_users
from bench.stats import hit_rate, mean, ratio, summarize
from hostmem.kv_dtype import KV_DTYPES

logger = logging.getLogger(__name__)

LEVELS = (1, 2, 4, 8, 16, 32)
SMOKE_LEVELS = (1, 2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench concurrency", description=__doc__.splitlines()[0])
    add_common_args(parser, "concurrency")
    parser.add_argument("--levels", type=int, nargs="+", help=f"concurrent sessions (default {LEVELS})")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per reply (default 32)")
    parser.add_argument("--conversations-per-session", type=int, default=3,
                        help="conversations in a level's queue per session (default 3; ScaleLLM sends "
                             "20 requests per concurrent one): the queue keeps every session busy until its end")
    parser.add_argument("--pool-tokens", type=int, default=32768,
                        help="the compute node's KV pool in tokens (default 32768: no preemption at 32 sessions)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the compute node's torch threads (default 0: one per CPU of its placement's)")
    parser.add_argument("--kv-dtypes", nargs="+", default=["float32"], choices=list(KV_DTYPES), metavar="DTYPE",
                        help="KV pool dtypes (compute.kv_dtype) to run, each with stacks of its own, in this run "
                             f"(default float32; of {', '.join(KV_DTYPES)})")
    add_placements_arg(parser)
    args = parser.parse_args(argv)
    args.kv_dtypes = list(dict.fromkeys(args.kv_dtypes))
    args.placements = chosen(args.placements)
    args.levels = args.levels or list(SMOKE_LEVELS if args.smoke else LEVELS)
    if args.smoke:
        args.turns, args.max_new_tokens, args.conversations_per_session = 2, min(args.max_new_tokens, 4), 1
    if args.conversations_per_session < 1:
        parser.error("--conversations-per-session must be at least 1")
    return args


def level_figures(conversations: list[list], wall_s: float, compute_before, compute_after) -> dict:
    """One level's Table-1 figures from every conversation's turns (and the compute node's counters)."""
    turns = [t for conversation in conversations for t in conversation]
    follow = [t for conversation in conversations for t in conversation[1:]]
    sources = collections.Counter(t.summary.kv_source for t in follow)
    tbt = [t.summary.tbt_ms for t in turns if t.summary.tokens_out > 1]
    tokens = sum(t.summary.tokens_out for t in turns)
    return {"turns": len(turns), "wall_s": wall_s,
            "ttft_ms": summarize([t.summary.ttft_ms for t in turns]),
            "client_ttft_ms": summarize([t.client_ttft_ms for t in turns]),
            "tbt_ms": summarize(tbt) if tbt else None,
            "output_tokens_per_s": ratio(tokens, wall_s), "output_tokens": tokens,
            "gateway_ms_mean": mean([t.summary.gateway_ms for t in turns]),
            "engine_ms_mean": mean([t.summary.engine_ms for t in turns]),
            "e2e_ms_mean": mean([t.summary.e2e_ms for t in turns]),
            "follow_ups": len(follow), "kv_source": dict(sources),
            "restore_hit_rate": hit_rate(sources.get("restored", 0), len(follow)),
            "preemptions": {kind: compute_after.preemptions[kind] - compute_before.preemptions.get(kind, 0)
                            for kind in compute_after.preemptions}}


def cpu_cores(before: Mapping[str, float], after: Mapping[str, float], wall_s: float) -> dict[str, float]:
    """Cores each process kept busy on average during a level (CPU seconds over wall seconds)."""
    return {name: ratio(after[name] - before.get(name, 0.0), wall_s) for name in after}


def outside_compute(cores: Mapping[str, float], machine_cores: int) -> float:
    """The share of the machine's cores that everything but the compute node used (frontend, agent,
    storage nodes, the benchmark's clients): CPU the forward could not have on a machine this size."""
    return sum(v for name, v in cores.items() if name != "compute") / machine_cores


def first_difference(expected: Mapping[str, Sequence[str]], got: Mapping[str, Sequence[str]]) -> list[str]:
    """Conversations whose replies differ from the reference: 'name turn i: expected ... got ...'."""
    out = []
    for name, want in expected.items():
        have = list(got.get(name, []))
        for i, reply in enumerate(want):
            if i >= len(have) or have[i] != reply:
                shown = have[i] if i < len(have) else "(no reply)"
                out.append(f"{name} turn {i + 1}: expected {reply!r}, got {shown!r}")
                break
    return out


def replies(outcomes: list) -> list[str]:
    return [t.reply for t in outcomes]


def workload(n: int, distinct: int, per_session: int) -> list[int]:
    """The conversations (as sessions.script indexes) that n sessions work through: each of the
    `distinct` ones ceil(n * per_session / distinct) times, interleaved, so that every level runs
    the same mix (one session runs each conversation once, one after the other)."""
    return list(range(distinct)) * -(-n * per_session // distinct)


def run_level(stack: Stack, n: int, args, reference: dict[str, list[str]],
              users: Iterator[str]) -> tuple[dict, list[str]]:
    """n sessions at once through the level's queue of conversations (each a new user's); their
    figures and the conversations whose replies differ."""
    queue = [(k, next(users)) for k in workload(n, len(reference), args.conversations_per_session)]
    before, cpu_before = stack.compute_stats(), stack.cpu_seconds()
    outcomes, wall_s = sessions.run_concurrent(
        stack.frontend, [(stack.token(user), sessions.script(k, args.turns)) for k, user in queue], n,
        args.max_new_tokens)
    failed = [f"conversation {q} ({user}): {o}" for q, ((_, user), o) in enumerate(zip(queue, outcomes))
              if isinstance(o, Exception)]
    if failed:
        return {"errors": failed}, failed
    got = {f"conversation {q} of {user} (topic {k})": replies(o)
           for q, ((k, user), o) in enumerate(zip(queue, outcomes))}
    want = {name: reference[name.split("topic ")[1].rstrip(")")] for name in got}
    differences = first_difference(want, got)
    figures = level_figures(outcomes, wall_s, before, stack.compute_stats())
    figures["conversations"] = len(queue)
    figures["cpu_cores"] = cpu_cores(cpu_before, stack.cpu_seconds(), wall_s)
    figures["replies_identical_to_alone"] = ratio(len(queue) - len(differences), len(queue))
    return figures, differences


def table(result: dict) -> str:
    head = ["sessions", "TTFT mean", "TTFT p50", "TTFT p99", "TBT mean", "TBT p50", "TBT p99",
            "tok/s", "gateway ms", "engine ms", "restored", "preempted", "same as alone", "CPU not compute"]
    rows = []
    for n, f in result["results"]["levels"].items():
        if "errors" in f or "failed" in f:
            error = failure_of(result, f"{n} sessions") or f.get("failed") or "; ".join(f.get("errors", []))
            rows.append([n, f"failed: {error.splitlines()[0][:160] if error else 'unknown'}",
                         *[""] * (len(head) - 2)])
            continue
        tbt = f["tbt_ms"] or {"mean": 0.0, "p50": 0.0, "p99": 0.0}
        rows.append([n, *(f"{v:.1f}" for v in (f["ttft_ms"]["mean"], f["ttft_ms"]["p50"], f["ttft_ms"]["p99"],
                                               tbt["mean"], tbt["p50"], tbt["p99"])),
                     f"{f['output_tokens_per_s']:.1f}", f"{f['gateway_ms_mean']:.1f}",
                     f"{f['engine_ms_mean']:.1f}", f"{f['restore_hit_rate']:.2f}",
                     str(sum(f["preemptions"].values())), f"{f['replies_identical_to_alone']:.2f}",
                     f"{outside_compute(f.get('cpu_cores', {}), result['machine']['cores']):.0%}"])
    s = result["settings"]
    return (f"conversations of {s['turns']} turns of {s['max_new_tokens']} tokens, "
            f"{s.get('conversations_per_session', 1)} or more per session, a pool of {s['pool_tokens']} "
            "tokens, "
            "times in ms (frontend's turn summaries); CPU not compute: the share of the machine's "
            f"{result['machine']['cores']} cores the other services and the clients used\n"
            f"{format_table(head, rows)}\n\n"
            f"{ratios_text(result['ratios'])}")


def plot(result: dict, out) -> Path | None:
    by = result["results"].get("by_placement") or {"": {"results": result["results"]}}
    series = {}
    for name, entry in by.items():
        levels = {int(n): f for n, f in (entry["results"].get("levels") or {}).items() if measured(f)}
        xs = sorted(levels)
        if not xs:
            continue
        for label, ys in (("TTFT p50", [levels[n]["ttft_ms"]["p50"] for n in xs]),
                          ("TTFT p99", [levels[n]["ttft_ms"]["p99"] for n in xs]),
                          ("TBT p50", [(levels[n]["tbt_ms"] or {"p50": 0})["p50"] for n in xs]),
                          ("gateway mean", [levels[n]["gateway_ms_mean"] for n in xs]),
                          ("engine mean", [levels[n]["engine_ms_mean"] for n in xs])):
            series[f"{label} ({name})" if len(by) > 1 else label] = (xs, ys)
    if not series:
        return None
    return plot_lines(out / "concurrency.png", series, title="Latency against concurrent sessions",
                      xlabel="concurrent sessions", ylabel="ms", logx=True, logy=True)


def key_figures(sub: dict) -> dict[str, float]:
    """One placement's key figures, compared across placements: output tokens/s at each level
    measured, and at the most sessions against one."""
    levels = {int(n): f for n, f in (sub["results"].get("levels") or {}).items() if measured(f)}
    out = {f"tokens_per_s_{n}": levels[n]["output_tokens_per_s"] for n in sorted(levels)}
    top = max(levels, default=None)
    if top and f"tokens_per_s_{top}_vs_1" in sub["ratios"]:
        out[f"tokens_per_s_{top}_vs_1"] = sub["ratios"][f"tokens_per_s_{top}_vs_1"]
    return out


def measure(args: argparse.Namespace, placement: str, sub: dict, progress, kv_dtype: str = "float32") -> list[str]:
    """The reference and every level in one stack started in `placement`, into sub (results,
    ratios, failed); the replies that differ from alone."""
    distinct = min(max(args.levels), len(sessions.TOPICS))
    count = distinct + sum(len(workload(n, distinct, args.conversations_per_session)) for n in args.levels)
    users = iter(bench_users(count))  # one per conversation: nothing stored by one is another's
    config = bench_config(pool_tokens=args.pool_tokens, max_context_tokens=1024, users=count,
                          max_new_tokens=args.max_new_tokens,
                          compute={"torch_threads": args.torch_threads, "kv_dtype": kv_dtype})
    differences: list[str] = []
    with Stack(services_dir(args, f"concurrency-{placement}-{kv_dtype}"), config, keep_data=args.keep_data,
               placement=placement) as stack:
        reference = {}
        for i in range(distinct):
            alone = sessions.run_session(stack.frontend, stack.token(next(users)),
                                         sessions.script(i, args.turns), args.max_new_tokens)
            reference[str(i)] = replies(alone)
            progress.update(note=f"{placement} reference {i}")
        sub["results"]["reference_replies"] = reference
        sub["results"]["levels"] = {}
        for n in args.levels:
            try:
                figures, diff = run_level(stack, n, args, reference, users)
            except Exception as exc:  # noqa: BLE001 - a failed level is reported with its error
                entry = fail(sub, f"{n} sessions", exc)
                figures, diff = {"failed": entry["error"]}, []
            else:
                if "errors" in figures:
                    fail(sub, f"{n} sessions", RuntimeError(
                        f"{len(figures['errors'])} conversations failed; the first: {figures['errors'][0]}"))
                    diff = []
            sub["results"]["levels"][str(n)] = figures
            differences += [f"{n} sessions: {d}" for d in diff]
            progress.update(note=f"{placement} {n} sessions")
        stats = stack.agent_stats()
        sub["results"]["agent_stats"] = {"hits": stats.hits, "misses": stats.misses}
    sub["results"]["replies_identical_to_alone"] = not differences
    sub["results"]["differences"] = differences
    add_ratios(sub)
    return differences


def report(result: dict) -> str:
    """Each placement's table, then the key figures side by side (per KV dtype, when several ran)."""
    by_dtype = result["results"].get("by_kv_dtype")
    if not by_dtype:
        return tables(result, table)
    parts = []
    for dtype, r in by_dtype.items():
        one = {**result, "results": r["results"], "ratios": r["ratios"], "failed": r["failed"]}
        parts.append(f"KV pool dtype {dtype}\n{tables(one, table)}")
    dtype_ratios = {k: v for k, v in result["ratios"].items() if k.endswith(f"_vs_{next(iter(by_dtype))}")}
    return "\n\n".join(parts) + f"\n\neach dtype over the first, in this run\n{ratios_text(dtype_ratios)}"


def run(args: argparse.Namespace) -> tuple[dict, list[str]]:
    settings = {"levels": args.levels, "turns": args.turns, "max_new_tokens": args.max_new_tokens,
                "conversations_per_session": args.conversations_per_session,
                "pool_tokens": args.pool_tokens, "policy": "triggered", "torch_threads": args.torch_threads,
                "smoke": args.smoke, "placements": args.placements, "kv_dtypes": args.kv_dtypes}
    distinct = min(max(args.levels), len(sessions.TOPICS))
    differences: list[str] = []
    by_dtype: dict[str, dict] = {}
    steps = len(args.kv_dtypes) * len(args.placements) * (distinct + len(args.levels))
    with progress_for(args, steps, "concurrency") as progress:
        for dtype in args.kv_dtypes:
            one_dtype = new_result("concurrency", {**settings, "kv_dtype": dtype})

            def one(placement: str, sub: dict, dtype=dtype) -> None:
                where = placement if len(args.kv_dtypes) == 1 else f"{placement} {dtype}"
                differences.extend(f"{where}: {d}" for d in measure(args, placement, sub, progress, dtype))

            run_placements(one_dtype, args.placements, one, key_figures)
            by_dtype[dtype] = one_dtype
    result = by_dtype[args.kv_dtypes[0]]
    result["settings"] = settings
    if len(args.kv_dtypes) > 1:
        add_dtype_ratios(result, by_dtype)
    result["results"]["replies_identical_to_alone"] = not differences
    result["results"]["differences"] = differences
    result["plots"] = plots(plot(result, args.out))
    return result, differences


def add_dtype_ratios(result: dict, by_dtype: dict[str, dict]) -> None:
    """Every dtype's result under results.by_kv_dtype, its ratios and failures marked `@<dtype>`, and each
    later dtype's key figures over the first's, per placement: `<figure>@<placement>@<dtype>_vs_<first>`."""
    first, *others = by_dtype
    # each dtype's own (the first's results copied before this key joins them: no cycle)
    result["results"]["by_kv_dtype"] = {d: {"results": dict(r["results"]), "ratios": dict(r["ratios"]),
                                            "floors": dict(r.get("floors", {})), "failed": list(r["failed"])}
                                        for d, r in by_dtype.items()}
    for dtype in others:
        r = by_dtype[dtype]
        result["ratios"] |= {f"{k}@{dtype}": v for k, v in r["ratios"].items()}
        result["failed"] += [{"part": f"{dtype}: {f['part']}", "error": f["error"]} for f in r["failed"]]
        for placement, sub in r["results"].get("by_placement", {}).items():
            base = result["results"].get("by_placement", {}).get(placement, {}).get("key_figures", {})
            for k, v in sub.get("key_figures", {}).items():
                if k in base:
                    result["ratios"][f"{k}@{placement}@{dtype}_vs_{first}"] = ratio(v, base[k])


FLOORS = {"tokens_per_s_32_vs_1": 6.0}    # issue 21: at least (goal 8)
CEILINGS = {"ttft_p50_8_vs_1": 4.0}        # at most


def measured(figures: dict) -> bool:
    """A level that ran to its end (not failed, no conversation failed)."""
    return "errors" not in figures and "failed" not in figures


def add_ratios(result: dict) -> None:
    """Throughput and TTFT at each level against one session, measured in the same run (a failed
    level has no ratio: it is in result["failed"], and so is level 1's failure for every ratio)."""
    levels = {int(n): f for n, f in result["results"]["levels"].items() if measured(f)}
    if 1 not in levels:
        return
    for n in sorted(levels):
        if n == 1:
            continue
        result["ratios"][f"tokens_per_s_{n}_vs_1"] = ratio(levels[n]["output_tokens_per_s"],
                                                           levels[1]["output_tokens_per_s"])
        result["ratios"][f"ttft_p50_{n}_vs_1"] = ratio(levels[n]["ttft_ms"]["p50"], levels[1]["ttft_ms"]["p50"])
    top = max(levels)
    result["ratios"][f"gateway_vs_engine_{top}"] = ratio(levels[top]["gateway_ms_mean"], levels[top]["engine_ms_mean"])
    result["floors"] = floors(result["ratios"], FLOORS, CEILINGS)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging(args)
    with stop_on_sigterm():  # a SIGTERM stops the stack's services
        result, differences = run(args)
    finish(args, result, report(result))
    if differences:  # batched float math may differ from batch 1 in the last bits: reported, not fatal
        print("kvtb bench concurrency: replies that differ from the same conversation alone:", file=sys.stderr)
        for line in differences:
            print(f"  {line}", file=sys.stderr)
    return 1 if result["failed"] else 0
