"""`kvtb bench replay`: stateless clients resending history (multi-round QA) and a Mooncake-format trace.

(a) Multi-round QA (bench.multiround, LMCache's shape): N users, R rounds, a system prompt common to
all (the frontend's `shared_system_prompts` for the users' tenant), think time between rounds;
every request resends the whole history over the OpenAI API with no session header. It runs on two
stacks one after the other, with the compute node's policy `triggered` (a follow-up's prefix is
found by content and restored from storage) and `recompute` (nothing kept: the HTTP API has no
per-request policy, so each policy gets its own stack, started and warmed up alike). Reported:
follow-up TTFT p50/p99 (client side, to the first token), the share of prompt tokens the API says
were cached, storage bytes and evictions, and whether both policies gave the same replies.

(b) A trace in the Mooncake FAST'25 format (`--trace FILE.jsonl`, or `--synthetic N` requests in
`--trace-users` groups sharing 3-8 leading blocks), its blocks scaled to the engine's
(`--trace-block-tokens`, default 32), replayed at its timestamps (divided by `--speedup`) by
`--trace-users` users (bench.mooncake.users_of: a group's requests are one user's, and users share
no prefix, as KV is salted per user) on a `triggered` stack of its own whose pool
(`--trace-pool-tokens`) holds a fraction of the users' working set, so that reuse needs the
storage tier (and `--trace-capacity-mib` may bound that too); prompts are built so that equal hash
ids are equal text (bench.trace_prompts, checked against the compute node's chat template).
Reported: hit tokens against the trace's ideal per user (bench.mooncake.ideal_blocks; each
request's hit counted at most up to its own ideal, what it could have reused), what the ideal is
and why a cache could miss it (`ideal`), the working set against the pool, storage bytes,
evictions. A workload that fails is reported failed with its error (`failed`).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

import aiohttp

from bench import mooncake, multiround, trace_replay
from bench.openai_client import chat, messages_of, model_name
from bench.results import (
    add_common_args,
    failed_text,
    floors,
    format_bytes,
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
from bench.stats import median, ratio, summarize
from bench.trace_prompts import BlockText, single_token_words
from kvtb.rpc import OPERATOR, Security, channel
from kvtb_proto import compute_pb2, storage_admin_pb2, storage_admin_pb2_grpc

logger = logging.getLogger(__name__)

FLOORS = {"prefix_hit_vs_ideal": 0.9}
POLICIES = ("triggered", "recompute")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvtb bench replay", description=__doc__.splitlines()[0])
    add_common_args(p, "replay")
    p.add_argument("--workloads", nargs="+", choices=("qa", "trace"), default=["qa", "trace"])
    qa = p.add_argument_group("multi-round QA")
    qa.add_argument("--users", type=int, default=4)
    qa.add_argument("--rounds", type=int, default=3)
    qa.add_argument("--context-words", type=int, default=480, help="each user's notes (about a token a word)")
    qa.add_argument("--system-words", type=int, default=64, help="the shared system prompt (0: none)")
    qa.add_argument("--think-s", type=float, default=1.0, help="think time between a user's rounds")
    qa.add_argument("--max-new-tokens", type=int, default=16, help="answer length")
    qa.add_argument("--reps", type=int, default=2,
                    help="runs per policy, alternating (new users and notes each time; default 2)")
    tr = p.add_argument_group("Mooncake trace")
    tr.add_argument("--trace", type=Path, metavar="FILE.jsonl", help="a trace in Mooncake's format")
    tr.add_argument("--synthetic", type=int, default=160, metavar="N",
                    help="else N synthetic requests (default 160)")
    tr.add_argument("--trace-users", type=int, default=16,
                    help="users replaying the trace: the synthetic trace's groups, or a real trace's groups "
                         "(requests with the same first block) dealt among them (default 16)")
    tr.add_argument("--trace-pool-tokens", type=int, default=4096,
                    help="the trace stack's KV pool (default 4096: a fraction of the users' working set)")
    tr.add_argument("--trace-capacity-mib", type=int, default=0,
                    help="the agent's storage capacity for the trace (0: the default, beyond the "
                         "working set)")
    tr.add_argument("--write-trace", type=Path, metavar="FILE.jsonl", help="also save the trace replayed (unscaled)")
    tr.add_argument("--source-block-tokens", type=int, default=mooncake.MOONCAKE_BLOCK_TOKENS,
                    help="tokens per hash id in the trace (Mooncake: 512)")
    tr.add_argument("--trace-block-tokens", type=int, default=32,
                    help="tokens per hash id in the prompts sent (default 32: the engine's block_tokens)")
    tr.add_argument("--speedup", type=float, default=1.0, help="replay this many times faster than the timestamps")
    tr.add_argument("--trace-max-new-tokens", type=int, default=8, help="cap on each request's scaled output")
    p.add_argument("--pool-tokens", type=int, default=16384, help="the compute node's KV pool")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.smoke:
        args.users, args.rounds, args.context_words, args.system_words = 2, 2, 48, 16
        args.think_s, args.max_new_tokens, args.synthetic, args.reps = 0.2, 4, min(args.synthetic, 8), 1
        args.speedup, args.trace_max_new_tokens, args.pool_tokens = max(args.speedup, 4.0), 2, 4096
        args.synthetic, args.trace_users = min(args.synthetic, 12), min(args.trace_users, 3)
        args.trace_pool_tokens = 1024
    if args.trace_users < 1:
        p.error("--trace-users must be at least 1")
    return args


def workload(args, rep: int = 0) -> multiround.QaWorkload:
    """Repetition rep's workload: its own notes (the system prompt is the same in all)."""
    return multiround.QaWorkload(args.users, args.rounds, args.context_words, args.system_words, args.think_s,
                                 args.max_new_tokens, args.seed + rep)


def qa_users(args, rep: int) -> list[str]:
    return [f"u{rep * args.users + u}" for u in range(args.users)]


def trace_users(args) -> list[str]:
    """The trace stack's users, one per trace user (its warm-up user is the next one)."""
    return [f"u{k}" for k in range(args.trace_users)]


def warm_up_user(args) -> str:
    return f"u{args.reps * args.users + 1}"


def stack_config(args) -> dict:
    """Users of their own for each repetition of the QA, the trace and the warm-up; the QA's system
    prompt is its tenant's shared system prompt."""
    system = multiround.system_prompt(workload(args))
    frontend = {"shared_system_prompts": {"default": system}} if system else {}
    return bench_config(pool_tokens=args.pool_tokens, max_context_tokens=4096, users=args.reps * args.users + 2,
                        max_new_tokens=args.max_new_tokens, frontend=frontend)


def trace_stack_config(args) -> dict:
    """The trace's own stack: its users, a pool of --trace-pool-tokens, the agent's capacity if bounded."""
    smartnic = ({"capacity_high_bytes": args.trace_capacity_mib << 20,
                 "capacity_low_bytes": int(0.8 * (args.trace_capacity_mib << 20))}
                if args.trace_capacity_mib else {})
    return bench_config(pool_tokens=args.trace_pool_tokens, max_context_tokens=4096,
                        users=args.trace_users + 1, max_new_tokens=args.trace_max_new_tokens,
                        smartnic=smartnic)


def storage_figures(stack: Stack) -> dict:
    """The agent's and the storage nodes' counters: bytes put and stored, evictions, hits, and the
    agent's trigger-to-fire percentiles so far (over every standing PUT this stack fired)."""
    a = stack.agent_stats()
    used = 0
    for proc in [p for p in stack.deployment.procs if p.name.startswith("storage-")]:
        security = Security.of(OPERATOR, str(stack.deployment.credentials_dir))
        with channel(proc.addresses["admin"], security, peer="storage") as ch:
            reply = storage_admin_pb2_grpc.StorageAdminStub(ch).Stats(storage_admin_pb2.StatsRequest(), timeout=10)
        used += sum(ns.used_bytes for ns in reply.namespaces)
    c = stack.compute_stats()
    return {"bytes_put": a.bytes_put, "bytes_stored": a.bytes_stored, "chunks": a.chunks,
            "storage_used_bytes": used, "evictions": dict(a.evictions_by_reason), "hits": a.hits,
            "misses": a.misses, "kv_source": dict(c.kv_source_counts),
            "trigger_to_fire_us": {"p50": a.trigger_to_fire_p50_us, "p99": a.trigger_to_fire_p99_us,
                                   "fired": a.triggered_fired}}


def delta(before: dict, after: dict) -> dict:
    """Counters over a workload (levels such as bytes_stored are taken at its end)."""
    out = dict(after)
    for key in ("bytes_put", "hits", "misses"):
        out[key] = after[key] - before[key]
    for key in ("evictions", "kv_source"):  # (trigger_to_fire_us: the agent's percentiles at the end)
        out[key] = {k: v - before[key].get(k, 0) for k, v in after[key].items() if v - before[key].get(k, 0)}
    out["evicted"] = sum(out["evictions"].values())
    return out


def base_url(stack: Stack) -> str:
    return "http://" + stack.address("frontend", "http")


def warm_up(stack: Stack, user: str) -> str:
    """One short untimed chat of `user` (first calls are slow); the model's name."""
    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            token = stack.token(user)
            model = await model_name(session, base_url(stack), token)
            await chat(session, base_url(stack), token, model, messages_of(None, [], "Hello!"), 4)
            return model
    return asyncio.run(go())


def qa_figures(rounds: list[tuple[int, multiround.Round]], wall_s: float, storage: dict) -> dict:
    """A policy's figures over its repetitions' rounds ((rep, round) pairs)."""
    keys = {id(r): f"{rep}/{r.user}/{r.round}" for rep, r in rounds}
    rounds = [r for _, r in rounds]
    ok = [r for r in rounds if r.reply]
    follow = [r for r in ok if r.round > 0]
    first = [r for r in ok if r.round == 0]

    def share(rs):
        return ratio(sum(r.reply.cached_tokens for r in rs), sum(r.reply.prompt_tokens for r in rs))
    return {"rounds": len(rounds), "failed": [f"user {r.user} round {r.round}: {r.error}" for r in rounds if r.error],
            "wall_s": wall_s, "followup_ttft_s": summarize([r.reply.ttft_s for r in follow]) if follow else None,
            "first_ttft_s": summarize([r.reply.ttft_s for r in first]) if first else None,
            "cached_share": share(ok), "followup_cached_share": share(follow),
            "first_round_cached_tokens": [r.reply.cached_tokens for r in first],
            "prompt_tokens": sum(r.reply.prompt_tokens for r in ok),
            "followup_prompt_tokens_mean": sum(r.reply.prompt_tokens for r in follow) / max(1, len(follow)),
            "ttft_by_round_s": {str(k): [r.reply.ttft_s for r in ok if r.round == k] for k in range(1 + max(
                (r.round for r in ok), default=0))},
            "replies": {keys[id(r)]: r.reply.text for r in ok}, "storage": storage}


def run_qa(stack: Stack, args, model: str, rep: int) -> tuple[list[tuple[int, multiround.Round]], float]:
    """One repetition of the QA on one stack: its rounds and wall time."""
    tokens = [stack.token(u) for u in qa_users(args, rep)]
    rounds, wall_s = asyncio.run(multiround.run(base_url(stack), tokens, model, workload(args, rep)))
    return [(rep, r) for r in rounds], wall_s


def load_requests(args) -> tuple[list[mooncake.TraceRequest], str]:
    if args.trace:
        requests, source = mooncake.load_trace(args.trace), str(args.trace)
    else:
        requests = mooncake.synthetic_trace(args.synthetic, args.seed, groups=args.trace_users,
                                            block_tokens=args.source_block_tokens)
        source = (f"synthetic: {args.synthetic} requests in {args.trace_users} groups (one user's each), "
                  f"seed {args.seed}")
    mooncake.check_blocks(requests, args.source_block_tokens)
    if args.write_trace:
        args.write_trace.write_text(mooncake.dump_trace(requests))
    return requests, source


def tokenizer(stack: Stack):
    """The compute node's tokenizer, from its model cache (the node has written it by now)."""
    from tokenizers import Tokenizer

    from compute_node.settings import ComputeSettings
    cache = stack.config["compute"].get("model_cache_dir") or ComputeSettings().model_cache_dir
    tok = Tokenizer.from_file(str(Path(cache) / "tokenizer.json"))
    return tok, (lambda text: tok.encode(text, add_special_tokens=False).ids)


def working_set(plan: trace_replay.TracePlan) -> dict:
    """The distinct blocks the trace's users send (each user's heads and prefixes), in tokens."""
    blocks = {(plan.user(i), r.hash_ids[:k + 1])
              for i, r in enumerate(plan.requests) for k in range(len(r.hash_ids))}
    users = len(set(plan.users)) if plan.users else 1
    tokens = len(blocks) * plan.block_tokens + users * plan.head_tokens
    return {"blocks": len(blocks) + users * plan.head_tokens // plan.block_tokens, "tokens": tokens}


def run_trace(stack: Stack, args, model: str) -> dict:
    requests, source = load_requests(args)
    scaled = mooncake.scale(requests, args.source_block_tokens, args.trace_block_tokens)
    users = mooncake.users_of(scaled, args.trace_users)
    tok, encode = tokenizer(stack)
    text = BlockText(single_token_words(tok.get_vocab(), encode), args.trace_block_tokens, args.seed)
    with stack.agent_channel() as ch:
        stub = stack.compute_stub(ch)

        def encode_chat(system: str, user: str) -> list[int]:
            msgs = [compute_pb2.ChatMessage(role="system", content=system),
                    compute_pb2.ChatMessage(role="user", content=user)]
            return list(stub.EncodeChat(compute_pb2.EncodeChatRequest(messages=msgs, add_generation_prompt=True),
                                        timeout=60).token_ids)
        plan = trace_replay.prepare(scaled, text, encode, encode_chat, users)
    before = storage_figures(stack)
    tokens = [stack.token(u) for u in trace_users(args)]
    sent, wall_s = asyncio.run(trace_replay.replay(base_url(stack), tokens, model, plan,
                                                   args.speedup, args.trace_max_new_tokens))
    return {"source": source, "wall_s": wall_s,
            "sharing": f"{len(set(users))} users, no prefix shared across users (KV is salted per user)",
            "working_set": working_set(plan), "pool_tokens": args.trace_pool_tokens,
            "capacity_mib": args.trace_capacity_mib or None,
            **trace_replay.figures(plan, sent), "storage": delta(before, storage_figures(stack))}


def run(args: argparse.Namespace) -> dict:
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "out", "keep_data")}
    result = new_result("replay", {**settings, "trace": str(args.trace or ""),
                                   "write_trace": str(args.write_trace or "")})
    qa, trace = "qa" in args.workloads, "trace" in args.workloads
    steps = qa * len(POLICIES) * (1 + args.reps) + trace * 2
    with progress_for(args, steps, "replay") as progress:
        if qa:
            result["results"]["qa"] = run_part(result, "qa", lambda: run_qa_stacks(args, progress))
        if trace:
            result["results"]["trace"] = run_part(result, "trace", lambda: run_trace_stack(args, progress))
    result["results"] = {k: v for k, v in result["results"].items() if v is not None}
    add_ratios(result)
    result["plots"] = plots(*plot(result, Path(args.out)))
    return result


def run_qa_stacks(args, progress) -> dict:
    """The QA on a stack per policy, both up at once (the repetitions alternate between them)."""
    with contextlib.ExitStack() as up:
        stacks, models = {}, {}
        for policy in POLICIES:
            stack = Stack(services_dir(args, f"replay-{policy}"), stack_config(args), policy=policy,
                          keep_data=args.keep_data)
            stacks[policy] = up.enter_context(stack)
            models[policy] = warm_up(stacks[policy], warm_up_user(args))
            progress.update(note=f"{policy} stack up")
        return run_qa_reps(args, stacks, models, progress)


def run_trace_stack(args, progress) -> dict:
    """The trace on a `triggered` stack of its own (its pool and capacity, its users)."""
    with Stack(services_dir(args, "replay-trace"), trace_stack_config(args), policy="triggered",
               keep_data=args.keep_data) as stack:
        model = warm_up(stack, f"u{args.trace_users}")
        progress.update(note="trace stack up")
        out = run_trace(stack, args, model)
        progress.update(note="trace")
        return out


def run_qa_reps(args, stacks: dict[str, Stack], models: dict[str, str], progress) -> dict:
    """The QA's repetitions, the policies in turn (recompute first, then the other way round)."""
    rounds: dict[str, list] = {p: [] for p in POLICIES}
    wall = dict.fromkeys(POLICIES, 0.0)
    before = {p: storage_figures(stacks[p]) for p in POLICIES}
    for rep in range(args.reps):
        for policy in POLICIES[::-1] if rep % 2 == 0 else POLICIES:
            got, wall_s = run_qa(stacks[policy], args, models[policy], rep)
            rounds[policy] += got
            wall[policy] += wall_s
            progress.update(note=f"qa {policy} {rep + 1}/{args.reps}")
    return {p: qa_figures(rounds[p], wall[p], delta(before[p], storage_figures(stacks[p]))) for p in POLICIES}


def add_ratios(result: dict) -> None:
    qa, trace = result["results"].get("qa", {}), result["results"].get("trace")
    if all((qa.get(p) or {}).get("followup_ttft_s") for p in POLICIES):
        restored, recomputed = qa["triggered"]["followup_ttft_s"], qa["recompute"]["followup_ttft_s"]
        result["ratios"]["followup_ttft_recompute_vs_restore"] = ratio(recomputed["p50"], restored["p50"])
        result["ratios"]["followup_ttft_p99_recompute_vs_restore"] = ratio(recomputed["p99"], restored["p99"])
        same = [k for k, v in qa["triggered"]["replies"].items() if qa["recompute"]["replies"].get(k) == v]
        qa["replies_identical_across_policies"] = ratio(len(same), len(qa["recompute"]["replies"]))
    if trace and trace["ideal_tokens"]:
        result["ratios"]["prefix_hit_vs_ideal"] = trace["prefix_hit_vs_ideal"]
    result["floors"] = floors(result["ratios"], FLOORS)


def plot(result: dict, out: Path) -> list:
    drawn = []
    qa = result["results"].get("qa", {})
    if qa:
        series = {}
        for policy in POLICIES:
            by_round = (qa.get(policy) or {}).get("ttft_by_round_s") or {}
            rounds = sorted(int(k) for k, v in by_round.items() if v)
            series[f"{policy} (median)"] = (rounds, [median(by_round[str(k)]) * 1e3 for k in rounds])
        drawn.append(plot_lines(out / "replay-qa.png", series, title="Multi-round QA: TTFT by round",
                                xlabel="round (0: the first, with the notes)", ylabel="TTFT (ms)"))
    trace = result["results"].get("trace")
    if trace:
        rows = trace["per_request"]
        xs = [r["index"] for r in rows]
        drawn.append(plot_lines(out / "replay-trace.png", {
            "ideal (trace)": (xs, [r["ideal_tokens"] for r in rows]),
            "served from cache": (xs, [r["hit_tokens"] for r in rows])},
            title="Trace replay: prefix tokens reused per request", xlabel="request", ylabel="tokens"))
    return drawn


def trigger_line(storage: dict) -> str:
    """The agent's trigger-to-fire latency under the replay's load (its whole run so far)."""
    t = storage.get("trigger_to_fire_us")
    if not t:
        return "trigger-to-fire: not reported"
    return (f"trigger-to-fire under this load (the agent, over its {t['fired']} fired PUTs): "
            f"p50 {t['p50']:.0f} µs, p99 {t['p99']:.0f} µs")


def sources(counts: dict) -> str:
    """'restored 8, none 4': where the turns' prefix KV came from (the compute node's counts)."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "-"


def table(result: dict) -> str:
    parts, s = [], result["settings"]
    qa = result["results"].get("qa")
    if qa:
        head = ["policy", "follow-up TTFT p50 ms", "p99 ms", "first TTFT p50 ms", "cached (follow-ups)",
                "bytes put", "stored", "evictions", "kv source", "failed"]
        rows = []
        for policy in POLICIES:
            f = qa.get(policy)
            if not f:
                continue
            ttft, first = f["followup_ttft_s"] or {"p50": 0, "p99": 0}, f["first_ttft_s"] or {"p50": 0}
            st = f["storage"]
            rows.append([policy, f"{ttft['p50'] * 1e3:.1f}", f"{ttft['p99'] * 1e3:.1f}", f"{first['p50'] * 1e3:.1f}",
                         f"{f['followup_cached_share']:.2f}", format_bytes(st["bytes_put"]),
                         format_bytes(st["bytes_stored"]), str(st["evicted"]), sources(st["kv_source"]),
                         str(len(f["failed"]))])
        parts.append(f"multi-round QA: {s['users']} users x {s['rounds']} rounds x {s['reps']} runs per policy, "
                     f"notes of {s['context_words']} "
                     f"words, system prompt {s['system_words']} words, think {s['think_s']} s, answers of "
                     f"{s['max_new_tokens']} tokens; stateless client, whole history resent\n"
                     f"{format_table(head, rows)}\nreplies identical across policies: "
                     f"{qa.get('replies_identical_across_policies', float('nan')):.2f}")
    t = result["results"].get("trace")
    if t:
        ws = t.get("working_set") or {"tokens": 0}
        parts.append(
            f"trace ({t['source']}; {t['sharing']}): {t['requests']} requests, {t['failed']} failed, blocks of "
            f"{s['trace_block_tokens']} tokens, speedup {s['speedup']}; working set {ws['tokens']} tokens, "
            f"pool {t.get('pool_tokens')} tokens"
            + (f", storage capacity {t['capacity_mib']} MiB" if t.get("capacity_mib") else "") + "\n"
            f"ideal prefix share {t['ideal_share']:.3f}, served from cache {t['hit_share']:.3f} "
            f"(hit/ideal {t['prefix_hit_vs_ideal']:.3f}, each request capped at its own ideal; "
            f"{t.get('requests_below_ideal', 0)} requests below it, "
            f"{t.get('hit_beyond_ideal_tokens', 0)} tokens beyond it); "
            f"trace's own reused-id share {t['seen_id_share']:.3f}\n"
            f"{t.get('ideal', '')}\n"
            f"TTFT p50 {(t['ttft_s'] or {'p50': 0})['p50'] * 1e3:.1f} ms, sent late p99 "
            f"{t['late_s']['p99'] * 1e3:.1f} ms; kv source {sources(t['storage']['kv_source'])}; bytes put "
            f"{format_bytes(t['storage']['bytes_put'])}, stored {format_bytes(t['storage']['bytes_stored'])}, "
            f"evictions {t['storage']['evicted']}; prompts not matching their blocks: {len(t['prompt_mismatches'])}\n"
            + trigger_line(t["storage"]))
    parts.append(ratios_text(result["ratios"]))
    if result.get("failed"):
        parts.append(failed_text(result))
    return "\n\n".join(parts)


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
