"""`kvtb study scalellm`: ScaleLLM's Table 1, Figs. 2, 6 and 7 through the frontend's OpenAI HTTP API,
and its gateway comparison (the same load through gRPC and HTTP).

ScaleLLM (../shared/papers/scalellm-paper.txt, §5) drives an endpoint with c concurrent clients,
each sending OpenAI-format requests back to back, 20 x c requests per level, c = 1 .. 256, replies of
up to 512 tokens, and measures TTFT and TBT of streamed requests (Table 1; a request not finished within
60 s is a timeout), the average latency split into engine and gateway latency (Figs. 2 and 6) and the
output throughput, every generated token over the level's wall time (Fig. 7).

Here: every service as a process (`kvtb up`'s wiring, bench.stack), c client coroutines on one
aiohttp session, each sending its share of the level's requests back to back through
POST /v1/chat/completions with `stream: true` and `stream_options.include_usage`, greedy. A request
still unfinished `--timeout-s` after it was sent is cancelled at that moment (the client closes the
stream; the frontend, the agent and the compute node cancel the turn, freeing its batch slot) and
counted as a timeout; a refused or broken one is counted as an error: neither is dropped. Every level
runs `--repeats` times (each repeat a sweep of all levels, with new users), so each claim is judged
over one value per repeat (bench.study.scalellm_claims). Full mode runs the seed's levels (1 .. 256),
replies (512 tokens) and timeout (60 s) with 3 requests per client (`--requests-per-client 20` for the
seed's 20 x c); quick mode keeps replies of 32 tokens, so its timeouts claim is out of scope.

The engine's time comes from each request's stored turn summary (gRPC GetContext as its user): the
compute node's time for the turn, its scheduler's queue included; the gateway's is the frontend's e2e
minus that. After the sweep, the gateway comparison sends the same load (one level) through the gRPC
Chat API and the HTTP API in turn (bench.study.scalellm_gateways).

With `--replicas 1 2` (ScaleLLM's Fig. 8 question), each replica count gets a stack of its own and the
same levels; bench.study.scalellm_replicas sets the counts side by side.

Figures are pure functions of the requests' records (bench.study.scalellm_figures), the claims a table
of pure functions of those (bench.study.scalellm_claims), the page bench.study.scalellm_page.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import scaled
from bench.openai_client import Message, messages_of
from bench.progress import Progress
from bench.results import data_dir, progress_for
from bench.stack import Stack, bench_config
from bench.stats import ratio
from bench.study import report
from bench.study.report import add_study_args, check_profile, main_of, new_study, run_part
from bench.study.scalellm_claims import CLAIMS, SEED, scope_replies
from bench.study.scalellm_clients import attach_summaries, compute_counters, run_clients, wait_idle, warm_up
from bench.study.scalellm_figures import (
    RequestRecord,
    classify,
    in_virtual_time,
    level_figures,
    measured_levels,
    pool,
    ratios,
    tbt_s,
    throughput,
    ttft_of,
    with_counters,
)
from bench.study.scalellm_gateways import PROTOCOLS, order, run_grpc_clients
from bench.study.scalellm_page import body_of, draw, intro_of, level_table, scaled_note
from bench.study.scalellm_replicas import REPLICA_CLAIMS, add_replica_ratios, draw_replicas

__all__ = ["SEED", "CLAIMS", "RequestRecord", "classify", "in_virtual_time", "level_figures", "tbt_s",
           "level_table", "headline_rows", "main"]

logger = logging.getLogger(__name__)

NAME = "scalellm"
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # ScaleLLM's 1 .. 256
QUICK_LEVELS = (1, 4, 16, 64)
SMOKE_LEVELS = (1, 2)
REQUESTS_PER_CLIENT = {"full": 3, "quick": 2, "smoke": 1}   # ScaleLLM: 20 x c requests per level
MAX_TOKENS = {"full": 512, "quick": 32, "smoke": 4}          # ScaleLLM: 512
REPEATS = {"full": 3, "quick": 3, "smoke": 1}
GATEWAY_LEVEL = {"full": 16, "quick": 16, "smoke": 2}        # the gateway comparison's concurrency
GATEWAY_MAX_TOKENS = 128   # its replies at most (full mode's 512 would time out at 16 here: no engine time)
TIMEOUT_S = 60.0      # ScaleLLM's user waiting threshold
IDLE_TIMEOUT_S = 900.0  # at most this long (x D) for a level's abandoned turns to leave the engine before the next
MAX_NUM_SEQS = 32     # the compute node's batch bound (its default): past it requests queue there
ROUTINGS = ("least_loaded", "kv_aware", "round_robin")   # the frontend's `routing` (chat_frontend.routing)
MAX_REPLICAS = 8

SYSTEM = "You are a helpful assistant. Answer in a few sentences."
STEMS = ("What is {}?", "How does {} work?", "Why would a team use {}?", "Explain {} to a new engineer.",
         "What are the main risks of {}?", "Give two examples of {} in practice.",
         "How would you test {}?", "What is a common mistake with {}?",
         "Compare {} with its usual alternative.",
         "Describe {} in one short paragraph.", "When is {} a bad idea?", "What does {} cost to run?",
         "How has {} changed in the last ten years?", "What should a beginner read about {}?",
         "Summarize the history of {}.", "What problem does {} solve?")
TOPICS = ("a key-value cache", "continuous batching", "a load balancer", "paged memory", "a write-ahead log",
          "TLS", "gradient descent", "a hash table", "rate limiting", "a message queue", "garbage collection",
          "a compiler", "RDMA", "a B-tree", "unit testing", "a content delivery network")


def question_of(i: int) -> str:
    """Question i: len(STEMS) * len(TOPICS) distinct ones (i and i + 1 always differ)."""
    return STEMS[i % len(STEMS)].format(TOPICS[(i // len(STEMS)) % len(TOPICS)])


def prompt_of(i: int) -> list[Message]:
    """The messages of request i: the system prompt and question i."""
    return messages_of(SYSTEM, [], question_of(i))


# -- options ------------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb study scalellm", description=__doc__.splitlines()[0])
    add_study_args(parser, NAME)
    parser.add_argument("--levels", type=int, nargs="+",
                        help=f"concurrent clients per level (default {LEVELS}; --quick {QUICK_LEVELS}; "
                             f"--smoke {SMOKE_LEVELS})")
    parser.add_argument("--requests-per-client", type=int,
                        help="requests each client sends back to back, so c x this per level (default 3; "
                             "--quick 2; --smoke 1; ScaleLLM: 20)")
    parser.add_argument("--max-tokens", type=int,
                        help="max_tokens of every request (default 512, ScaleLLM's; --quick 32; --smoke 4)")
    parser.add_argument("--repeats", type=int,
                        help="sweeps of every level (default 3, as --quick; --smoke 1): the claims' repeats")
    parser.add_argument("--gateway-level", type=int,
                        help="the gateway comparison's concurrency (default 16; --smoke 2; 0: skip it)")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S,
                        help="a request unfinished this long after it was sent is cancelled and counted a "
                             "timeout (default 60, ScaleLLM's)")
    parser.add_argument("--policy", default="triggered",
                        help="the deployment's KV policy (default triggered, the product's)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the compute node's torch threads (default 0: its default, all cores)")
    parser.add_argument("--pool-tokens", type=int, default=32768,
                        help="the compute node's KV pool in tokens (default 32768: 32 batched replies of 512 fit)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1],
                        help="replica counts, each a stack of its own running every level (default 1; "
                             "`--replicas 1 2`: ScaleLLM's Fig. 8, replica parallelism against one replica)")
    parser.add_argument("--routing", choices=ROUTINGS, default="least_loaded",
                        help="the frontend's routing over several replicas (default least_loaded: every "
                             "request is a new conversation, sharing at most its client's system prompt)")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    args.mode = mode
    args.levels = args.levels or list(SMOKE_LEVELS if args.smoke else QUICK_LEVELS if args.quick else LEVELS)
    args.requests_per_client = args.requests_per_client or REQUESTS_PER_CLIENT[mode]
    args.max_tokens = args.max_tokens or MAX_TOKENS[mode]
    args.repeats = REPEATS[mode] if args.repeats is None else args.repeats
    args.gateway_level = GATEWAY_LEVEL[mode] if args.gateway_level is None else args.gateway_level
    if any(c < 1 for c in args.levels):
        parser.error("every level needs at least one client")
    if args.requests_per_client < 1 or args.max_tokens < 1 or args.timeout_s <= 0 or args.repeats < 1:
        parser.error("--requests-per-client, --max-tokens and --repeats must be at least 1, --timeout-s positive")
    if args.gateway_level < 0:
        parser.error("--gateway-level: 0 (skip) or a concurrency")
    if any(n < 1 or n > MAX_REPLICAS for n in args.replicas):
        parser.error(f"--replicas: every count must be 1 .. {MAX_REPLICAS}")
    args.levels = sorted(set(args.levels))
    args.replicas = sorted(set(args.replicas))
    args.profile_obj = check_profile(parser, args, NAME)
    args.dilation = 1.0   # D, once chosen (run_levels)
    return args


def users_needed(args) -> int:
    """Every user the run gives a level, a repeat or a protocol (new users each: nothing one stored is
    another's), and the warm-up's."""
    sweep = sum(args.levels) * args.repeats * len(args.replicas)
    return 1 + sweep + 2 * args.gateway_level * args.repeats


# -- headline rows -------------------------------------------------------------------------------------

def _level_error(study: dict, c: int | None) -> str | None:
    if c is not None:
        f = study["results"].get("levels", {}).get(str(c))
        if f and "failed" in f:
            return " ".join(str(f["failed"]).split())
    if not study["results"].get("levels") and study["failed"]:
        return " ".join(study["failed"][0]["error"].split())
    return None


def headline_rows(study: dict) -> list[dict]:
    """Rows for the README's headline table: throughput and TTFT at the highest level against one
    client, and the gateway's share there (each 'failed: ERROR' when its level failed)."""
    levels = measured_levels(study["results"].get("levels", {}))
    asked = sorted(int(c) for c in study.get("settings", {}).get("levels", [])) or sorted(levels)
    top = asked[-1] if asked else None
    failure = _level_error(study, top) or _level_error(study, 1)

    def measured(text_of: Callable[[dict, dict], str]) -> str:
        if top in levels and 1 in levels:
            return text_of(levels[1], levels[top])
        if failure:
            return f"failed: {failure}"
        return "not measured"

    def tokens(a: dict, b: dict) -> str:
        (ta, kind), (tb, _) = throughput(a), throughput(b)
        return f"{ratio(tb, ta):.2f}x ({ta:.1f} -> {tb:.1f} tokens/s, {kind})"

    def ttft(a: dict, b: dict) -> str:
        ta, tb = ttft_of(a), ttft_of(b)
        timed_out = f"{b['timeouts']} of {b['requests']} timed out"
        if not (ta and tb):
            return f"no request answered at {1 if not ta else top}; {timed_out}"
        return (f"{tb['p50'] / ta['p50']:.1f}x ({ta['p50']:.0f} -> {tb['p50']:.0f} ms, "
                f"p99 {tb['p99']:.0f} ms); {timed_out}")

    def gateway(a: dict, b: dict) -> str:
        if b.get("gateway_share") is None:
            return f"no turn summary at {top}"
        return (f"{b['gateway_share']:.1%} (engine {b['engine_ms_mean']:.0f} ms, "
                f"gateway {b['gateway_ms_mean']:.0f} ms)")

    return [{"question": f"Output tokens/s, {top} concurrent / 1 (ScaleLLM Fig. 7)",
             "measured": measured(tokens),
             "target": "ScaleLLM: throughput grows with concurrency (Fig. 7, drawn without numbers)",
             "claim": "fig7-throughput-grows"},
            {"question": f"TTFT p50, {top} concurrent / 1, and timeouts at {top} (ScaleLLM Table 1)",
             "measured": measured(ttft),
             "target": "ScaleLLM: 4.0x (25.0 -> 99.4 ms), vLLM 5.9x, 1 to 64; 512-token replies, 60 s timeout",
             "claim": "table1-ttft-grows"},
            {"question": f"Gateway share of latency at {top} concurrent (ScaleLLM Fig. 6)",
             "measured": measured(gateway),
             "target": "ScaleLLM: the Python gateway becomes the bottleneck at 64-256 beside a fast engine",
             "claim": "fig6-gateway-new-bottleneck"}]


# -- running a level (I/O) ------------------------------------------------------------------------------

def run_level(stack: Stack, base_url: str, model: str, c: int, users: list[str], args, progress: Progress,
              repeat: int = 0, protocol: str = "http", max_tokens: int = 0) -> tuple[dict, list[RequestRecord]]:
    """c clients at once, args.requests_per_client requests each of max_tokens (default args.max_tokens),
    through `protocol`: the repeat's figures (in virtual time under a profile) and its records."""
    max_tokens = max_tokens or args.max_tokens
    tokens = {u: stack.token(u) for u in users}
    n = args.requests_per_client
    first = repeat * c * n   # each repeat asks the next questions
    clients = [(u, tokens[u]) for u in users]
    timeout_wall_s = args.timeout_s * args.dilation   # the timeout is virtual: D x it in wall time

    def done() -> None:
        progress.update(note=f"{c} concurrent" + ("" if protocol == "http" else " (gRPC)"))
    # the turns a level before abandoned at its timeout may still run on the engine: wait them out
    idle_wait_s = wait_idle(stack, IDLE_TIMEOUT_S * args.dilation)
    before, cpu_before = compute_counters(stack), stack.cpu_seconds()
    if protocol == "http":
        prompts = [[prompt_of(first + k * n + j) for j in range(n)] for k in range(c)]
        records, wall_s = asyncio.run(run_clients(base_url, model, clients, prompts, max_tokens,
                                                  timeout_wall_s, done))
    else:
        questions = [[question_of(first + k * n + j) for j in range(n)] for k in range(c)]
        records, wall_s = asyncio.run(run_grpc_clients(stack.frontend, clients, questions, max_tokens,
                                                       timeout_wall_s, done))
    after, cpu_after = compute_counters(stack), stack.cpu_seconds()
    if protocol == "http":
        attach_summaries(stack.frontend, records, tokens)
    cpu_wall_s = wall_s
    records, wall_s = in_virtual_time(records, wall_s, args.dilation)
    counted = before is not None and after is not None
    figures = with_counters(
        level_figures(records, wall_s, args.timeout_s),
        after["tokens_out"] - before["tokens_out"] if counted else None,
        {k: after["preemptions"][k] - before["preemptions"].get(k, 0) for k in after["preemptions"]}
        if counted else None,
        # cores each process kept busy during the level ("client": this process, the clients)
        {name: (cpu_after[name] - cpu_before.get(name, 0.0)) / cpu_wall_s for name in cpu_after})
    figures["idle_wait_s"] = idle_wait_s / args.dilation   # virtual, as the level's other times
    return figures, records


def run_levels(study: dict, args) -> None:
    """Under --profile: choose D, then run every stack under it (the services inherit it); back to real
    time at the end."""
    if args.profile_obj is None:
        run_stacks(study, args)
        return
    dilation, how, warmup = scaled.choose_dilation(args.profile_obj, args.dilation_value, args.smoke,
                                                   args.torch_threads)
    scaled.apply(args.profile_obj.name, dilation)  # before any stack starts: its services inherit it
    args.dilation = dilation
    study["settings"]["profile"], study["settings"]["dilation"] = args.profile_obj.name, dilation
    args.pacing = []
    try:
        run_stacks(study, args)
    finally:
        scaled.clear()
    study["scale"] = scaled.record(args.profile_obj, dilation, args.pacing, how)
    study["scale"]["warmup"] = warmup


def stack_config(args, users: int) -> dict:
    """The stack's config: the study's reply length, the batch bound, places for every level's turns,
    and the study's system prompt for gRPC turns (the HTTP clients send it themselves)."""
    compute: dict[str, Any] = {"max_num_seqs": MAX_NUM_SEQS, "torch_threads": args.torch_threads}
    return bench_config(pool_tokens=args.pool_tokens, max_context_tokens=1024, users=users,
                        max_new_tokens=args.max_tokens, compute=compute,
                        frontend={"max_concurrent_turns": max(64, *args.levels, args.gateway_level),
                                  "max_waiting_turns": 256, "queue_timeout_s": 600.0, "system_prompt": SYSTEM})


def run_stacks(study: dict, args) -> None:
    """Start the services, warm up, run each level (a failed level is recorded, the others go on)."""
    config = stack_config(args, users_needed(args))
    all_users = list(config["frontend"]["users"])
    total = args.requests_per_client * args.repeats * (sum(args.levels) * len(args.replicas)
                                                       + 2 * args.gateway_level)
    with data_dir(args, NAME) as services, progress_for(args, total, NAME) as progress:
        if args.smoke:
            from bench.study.tiny_model import make_tiny_model
            config["compute"]["model_cache_dir"] = str(make_tiny_model(services / "tiny-model"))
        given = iter(all_users[1:])
        if args.replicas == [1]:  # the study as it always was
            study["results"]["levels"] = {}
            run_stack(study, args, config, services / "stack", all_users[0], given, 1, study["results"]["levels"],
                      progress)
            return
        by = study["results"]["by_replicas"] = {}
        for n in args.replicas:
            levels = by.setdefault(str(n), {"levels": {}})["levels"]
            if n == args.replicas[0]:  # the single-count claims and plots are the smallest count's
                study["results"]["levels"] = levels
            run_part(study, f"services ({n} replica{'s' if n > 1 else ''})",
                     lambda: run_stack(study, args, replicas_config(config, n, args.routing),
                                       services / f"stack-{n}r", all_users[0], given, n, levels, progress))


def replicas_config(config: dict, replicas: int, routing: str) -> dict:
    """The config of a stack of `replicas` replicas: the frontend routes by `routing` over several."""
    if replicas == 1:
        return config
    return {**config, "frontend": {**config["frontend"], "routing": routing}}


def _take(given: Iterator[str], c: int) -> list[str]:
    return [next(given) for _ in range(c)]


def run_stack(study: dict, args, config: dict, path: Path, warm_user: str, given: Iterator[str], replicas: int,
              levels: dict, progress: Progress) -> None:
    """One stack of `replicas` replicas: every level `args.repeats` times into `levels` (each level's repeats
    pooled; a failed repeat recorded, the rest run), then, on the first stack, the gateway comparison."""
    with Stack(path, config, policy=args.policy, keep_data=args.keep_data, placement=args.placement,
               replicas=replicas) as stack:
        entry = study["results"].get("by_replicas", {}).get(str(replicas))
        if entry is not None:  # each count's CPUs: the page's machine line says only the last stack's
            entry["placement"] = {"cpus": stack.service_cpus(), "torch_threads": stack.compute_threads()}
        base_url = "http://" + stack.address("frontend", "http")
        model = warm_up(base_url, stack.token(warm_user), args.max_tokens, SYSTEM)
        study["results"]["model"] = model
        got: dict[int, list] = {c: [] for c in args.levels}
        errors: dict[int, str] = {}
        for r in range(args.repeats):
            for c in args.levels:
                users = _take(given, c)
                part = (f"level {c}" if args.replicas == [1] else f"level {c}, {replicas} replicas") \
                    + f", repeat {r + 1}"
                one = run_part(study, part, lambda: run_level(stack, base_url, model, c, users, args, progress, r))
                if one is None:
                    errors[c] = next(f["error"] for f in reversed(study["failed"]) if f["part"] == part)
                    progress.update(args.requests_per_client * c, note=f"{c} concurrent failed")
                got[c].append(errors[c] if one is None else one)
        for c in args.levels:
            ran = any(not isinstance(r, str) for r in got[c])
            levels[str(c)] = pool(got[c], args.timeout_s) if ran else {"failed": errors[c]}
        if args.gateway_level and replicas == args.replicas[0]:
            study["results"]["gateways"] = run_gateways(study, stack, base_url, model, given, args, progress)
        if args.profile_obj is not None:  # every service's pacer, the frontend's software stretch too
            args.pacing += scaled.stack_pacing(stack, frontend=True)


def run_gateways(study: dict, stack: Stack, base_url: str, model: str, given: Iterator[str], args,
                 progress: Progress) -> dict:
    """The same load (args.gateway_level clients, replies of at most GATEWAY_MAX_TOKENS) through HTTP and
    gRPC in each repeat, in alternated order."""
    c, max_tokens = args.gateway_level, min(args.max_tokens, GATEWAY_MAX_TOKENS)
    got: dict[str, list] = {"http": [], "grpc": []}
    errors: dict[str, str] = {}
    for r in range(args.repeats):
        for protocol in order(r):
            users = _take(given, c)
            part = f"gateway comparison, {protocol}, repeat {r + 1}"
            turn = args.repeats + 2 * r + PROTOCOLS.index(protocol)   # questions of their own (no cache hit)
            one = run_part(study, part, lambda: run_level(stack, base_url, model, c, users, args, progress,
                                                          turn, protocol, max_tokens))
            if one is None:
                errors[protocol] = next(f["error"] for f in reversed(study["failed"]) if f["part"] == part)
                progress.update(args.requests_per_client * c, note=f"{protocol} at {c} failed")
            got[protocol].append(errors[protocol] if one is None else one)
    pooled = {p: pool(runs, args.timeout_s) if any(not isinstance(r, str) for r in runs) else {"failed": errors[p]}
              for p, runs in got.items()}
    return {"level": c, "max_tokens": max_tokens, **pooled}


# -- the study --------------------------------------------------------------------------------------------

def settings_of(args) -> dict:
    return {"levels": args.levels, "requests_per_client": args.requests_per_client, "repeats": args.repeats,
            "requests_per_level": {str(c): args.requests_per_client * c for c in args.levels},
            "requests_total": args.requests_per_client * args.repeats * (sum(args.levels) * len(args.replicas)
                                                                        + 2 * args.gateway_level),
            "max_tokens": args.max_tokens, "timeout_s": args.timeout_s, "temperature": 0.0,
            "gateway_level": args.gateway_level, "gateway_max_tokens": min(args.max_tokens, GATEWAY_MAX_TOKENS),
            "stream": True, "include_usage": True, "api": "OpenAI HTTP /v1/chat/completions",
            "prompt": {"system": SYSTEM, "questions": len(STEMS) * len(TOPICS),
                       "example": prompt_of(0)[-1]["content"],
                       "shape": "a system prompt and one chat-style question; each client's questions "
                                "distinct"},
            "policy": args.policy, "pool_tokens": args.pool_tokens, "max_num_seqs": MAX_NUM_SEQS,
            "torch_threads": args.torch_threads, "replicas": args.replicas,
            "routing": args.routing if max(args.replicas) > 1 else None,
            "model": "tiny random Llama (smoke)" if args.smoke else "SmolLM2-135M", "smoke": args.smoke}


def judge(study: dict) -> None:
    """The claims tables judged on the study's results (the settings beside them), the timeouts claim
    scoped to the seed's condition; Fig. 8's only with several replica counts."""
    results = {**study["results"], "settings": study["settings"]}
    scope_replies(report.judge(study, CLAIMS, results), study["settings"])
    if len(study["settings"].get("replicas") or []) >= 2:
        report.judge(study, REPLICA_CLAIMS, results)


def run(args: argparse.Namespace) -> tuple[dict, str, str, str]:
    study = new_study(NAME, args, settings_of(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_part(study, "services", lambda: run_levels(study, args))
    study["ratios"].update(ratios(measured_levels(study["results"].get("levels", {}))))
    add_replica_ratios(study)
    judge(study)
    study["plots"] += [p for p in run_part(study, "plots", lambda: draw(study, out)) or [] if p]
    study["plots"] += [p for p in run_part(study, "plots", lambda: draw_replicas(study, out)) or [] if p]
    title = "ScaleLLM: latency and throughput against concurrency, through the OpenAI HTTP API"
    intro = intro_of(study)
    if args.profile_obj is not None:
        title += f", under the hardware profile `{args.profile_obj.name}` (virtual time)"
        intro = scaled_note(args.profile_obj) + "\n\n" + intro
    return study, title, intro, body_of(study)


main = main_of(parse_args, run)
