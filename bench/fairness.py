"""`kvtb bench fairness`: a modest user's turns alone and beside a greedy user holding many streams.

Every service runs as a process (`kvtb up`'s wiring, bench.stack) with the real model and the
frontend's admission settings as a deployment has them (its defaults, unless given). With
--long-prompt-tokens N (issue 42: one long prompt holding every step), the greedy user sends
--greedy-streams prompts of ~N tokens at once instead (each once; the frontend's caps, e.g.
--user-max-concurrent-turns 2, admit some), and the modest user's turns run beside them until
--long-alone-prompts of them are done; the long prompts' prefill tokens/s is reported alone (as many
sent alone first) against beside the modest user, and the target is a TTFT p50 within 3x of alone. The modest
user runs --modest-turns turns one after the other alone (each a new context with the same kind
of short question; half before the load, half after it, so that the machine's drift falls on both
sides), and the same number beside a greedy user's --greedy-streams streams (default 130, the
load of issue 31), each sending turns back to back and, when refused, trying again after the
Retry-After the frontend sends, from --settle-s seconds after they began. Reported side by side from one run: the modest user's turns served of attempted and
TTFT (the client's, from the request to the first text; and the frontend's) alone and under the
load, their ratio, and the greedy user's turns served and refused. Target: every modest turn served
and its TTFT p50 within 2x of alone (`ceilings`).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import time

import grpc

from bench.results import (
    add_common_args,
    fail,
    floors,
    format_table,
    new_result,
    ratios_text,
    run_bench,
    services_dir,
)
from bench.stack import Stack, bench_config
from bench.stats import ratio, summarize
from chat_frontend.settings import FrontendSettings
from compute_node.settings import ComputeSettings
from kvtb_proto import frontend_pb2, frontend_pb2_grpc

logger = logging.getLogger(__name__)

GREEDY, MODEST = "u0", "u1"
QUESTIONS = ("What is a storage node?", "What does a SmartNIC do?", "What is a KV cache?",
             "Why offload KV to storage?", "What is a queue pair?", "What is a trigger counter?")
FLOORS = {"modest_served_loaded": 1.0}                 # every modest turn served under the load
CEILINGS = {"modest_ttft_p50_loaded_vs_alone": 2.0}    # issue 31's target
LONG_CEILINGS = {"modest_ttft_p50_loaded_vs_alone": 3.0}  # issue 42's, beside long prompts
LONG_WORDS = ("storage", "queue", "block", "cache", "token", "offload", "restore", "fabric", "prefill", "decode",
              "agent", "region", "counter", "chunk", "replica", "tenant", "latency", "budget", "schedule", "step")
MAX_LOADED_S = 900.0  # the modest user's turns beside long prompts stop by then, done or not
RETRY_CAP_S = 5.0   # a refused greedy stream waits Retry-After, at most this
WARM_UP_TURNS = 2   # the modest user's turns before any measured (the model's first turns are slower)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench fairness", description=__doc__.splitlines()[0])
    add_common_args(parser, "fairness")
    parser.add_argument("--greedy-streams", type=int, default=130, help="the greedy user's streams (default 130)")
    parser.add_argument("--modest-turns", type=int, default=10, help="the modest user's turns per phase (default 10)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens per modest reply (default 16)")
    parser.add_argument("--greedy-max-new-tokens", type=int, default=64,
                        help="tokens per greedy reply (default 64)")
    parser.add_argument("--settle-s", type=float, default=5.0,
                        help="seconds the greedy load runs before the modest turns (default 5)")
    parser.add_argument("--long-prompt-tokens", type=int, default=0,
                        help="each greedy turn a prompt of about this many tokens, sent once (default 0: the "
                             "short turns of issue 31, back to back)")
    parser.add_argument("--long-alone-prompts", type=int, default=2,
                        help="long prompts sent at once alone, and done beside the modest user, for the prefill "
                             "tokens/s (default 2)")
    parser.add_argument("--step-target-s", type=float, default=ComputeSettings().step_target_s,
                        help=f"the compute node's step_target_s (default {ComputeSettings().step_target_s}; "
                             "0: no time bound)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the compute node's torch threads (default 0: one per CPU of its placement's)")
    defaults = FrontendSettings()
    for name in ("max_concurrent_turns", "max_waiting_turns", "user_max_concurrent_turns",
                 "user_max_waiting_turns", "user_max_queued_prompt_tokens"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name),
                            help=f"the frontend's {name} (default {getattr(defaults, name)}, the setting's)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.greedy_streams = min(args.greedy_streams, 16)
        args.modest_turns = min(args.modest_turns, 3)
        args.max_new_tokens, args.greedy_max_new_tokens = 4, 8
        args.settle_s = min(args.settle_s, 1.0)
        args.long_prompt_tokens = min(args.long_prompt_tokens, 512)
        args.long_alone_prompts = min(args.long_alone_prompts, 2)
    if args.greedy_streams < 1 or args.modest_turns < 1:
        parser.error("--greedy-streams and --modest-turns must be at least 1")
    if args.long_prompt_tokens < 0 or not 1 <= args.long_alone_prompts <= args.greedy_streams:
        parser.error("--long-prompt-tokens must be >= 0 and --long-alone-prompts in [1, --greedy-streams]")
    return args


@dataclasses.dataclass
class Turn:
    """One turn as a client saw it: served or its status, and its times (ms)."""

    status: str                 # "ok" or the gRPC status name
    client_ttft_ms: float = 0.0  # request sent to the first text
    ttft_ms: float = 0.0         # the frontend's (its turn summary)
    e2e_ms: float = 0.0
    prompt_tokens: int = 0       # the compute node's (prefilled and reused)
    done_s: float = 0.0          # when it ended (time.perf_counter())


def phase_figures(turns: list[Turn]) -> dict:
    """The modest user's figures in one phase: served of attempted, TTFT of the served turns."""
    served = [t for t in turns if t.status == "ok"]
    out = {"attempted": len(turns), "served": len(served),
           "statuses": {s: sum(t.status == s for t in turns) for s in sorted({t.status for t in turns})}}
    if served:
        out["client_ttft_ms"] = summarize([t.client_ttft_ms for t in served])
        out["ttft_ms"] = summarize([t.ttft_ms for t in served])
        out["e2e_ms"] = summarize([t.e2e_ms for t in served])
    return out


def add_ratios(result: dict) -> None:
    """Served share under the load, and the loaded phase's TTFT p50 against alone, from one run."""
    r = result["results"]
    alone, loaded = r.get("alone"), r.get("loaded")
    if not alone or not loaded:
        return
    result["ratios"]["modest_served_loaded"] = ratio(loaded["served"], loaded["attempted"])
    if "client_ttft_ms" in alone and "client_ttft_ms" in loaded:
        result["ratios"]["modest_ttft_p50_loaded_vs_alone"] = ratio(loaded["client_ttft_ms"]["p50"],
                                                                    alone["client_ttft_ms"]["p50"])
        result["ratios"]["modest_frontend_ttft_p50_loaded_vs_alone"] = ratio(loaded["ttft_ms"]["p50"],
                                                                             alone["ttft_ms"]["p50"])
    long = r.get("long") or {}
    if long.get("alone_tokens_per_s") and long.get("beside_tokens_per_s"):
        result["ratios"]["long_prefill_tokens_per_s_beside_vs_alone"] = ratio(long["beside_tokens_per_s"],
                                                                           long["alone_tokens_per_s"])
    ceilings = LONG_CEILINGS if result["settings"].get("long_prompt_tokens") else CEILINGS
    result["floors"] = floors(result["ratios"], FLOORS, ceilings)


async def one_turn(stub, token: str, message: str, max_new_tokens: int) -> tuple[Turn, float | None]:
    """A turn in a new context; (its outcome, the Retry-After a refusal carried)."""
    begin = time.perf_counter()
    first = None
    try:
        call = stub.Chat(frontend_pb2.ChatRequest(token=token, message=message, max_new_tokens=max_new_tokens))
        async for event in call:
            kind = event.WhichOneof("event")
            if kind == "text" and first is None:
                first = time.perf_counter()
            elif kind == "summary":
                s = event.summary
                client_ttft = ((first or time.perf_counter()) - begin) * 1e3
                return Turn("ok", client_ttft, s.ttft_ms, s.e2e_ms, s.tokens_prefilled + s.tokens_reused,
                            time.perf_counter()), None
        return Turn("NO_SUMMARY"), None
    except grpc.aio.AioRpcError as exc:
        retry = dict(exc.trailing_metadata() or ()).get("retry-after")
        return Turn(exc.code().name), float(retry) if retry else None


async def modest_phase(stub, token: str, turns: int, max_new_tokens: int) -> list[Turn]:
    out = []
    for i in range(turns):
        turn, _ = await one_turn(stub, token, QUESTIONS[i % len(QUESTIONS)], max_new_tokens)
        out.append(turn)
    return out


class GreedyLoad:
    """`streams` streams of one user, each sending turns back to back until stopped; a refused one
    waits the Retry-After it was told (at most RETRY_CAP_S)."""

    def __init__(self, stub, token: str, streams: int, max_new_tokens: int):
        self.stub, self.token, self.streams, self.max_new_tokens = stub, token, streams, max_new_tokens
        self.served = 0
        self.refused: dict[str, int] = {}
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._stream(i)) for i in range(self.streams)]

    async def _stream(self, i: int) -> None:
        n = 0
        while True:
            turn, retry = await one_turn(self.stub, self.token, f"Tell me a long story, part {i}.{n}.",
                                         self.max_new_tokens)
            n += 1
            if turn.status == "ok":
                self.served += 1
                continue
            self.refused[turn.status] = self.refused.get(turn.status, 0) + 1
            await asyncio.sleep(min(retry or 1.0, RETRY_CAP_S))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def figures(self) -> dict:
        return {"streams": self.streams, "served": self.served, "refused": dict(self.refused)}


async def measure(frontend: str, args: argparse.Namespace, tokens: dict[str, str]) -> dict:
    """Both phases against the running stack: {alone, loaded, greedy}."""
    async with grpc.aio.insecure_channel(frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        await modest_phase(stub, tokens[MODEST], WARM_UP_TURNS, args.max_new_tokens)  # the model's first turns
        before = -(-args.modest_turns // 2)
        alone = await modest_phase(stub, tokens[MODEST], before, args.max_new_tokens)
        load = GreedyLoad(stub, tokens[GREEDY], args.greedy_streams, args.greedy_max_new_tokens)
        load.start()
        try:
            await asyncio.sleep(args.settle_s)
            began = time.perf_counter()
            loaded = await modest_phase(stub, tokens[MODEST], args.modest_turns, args.max_new_tokens)
            loaded_s = time.perf_counter() - began
        finally:
            await load.stop()
        await asyncio.sleep(args.settle_s)  # the greedy turns cancelled, their KV offloaded
        alone += await modest_phase(stub, tokens[MODEST], args.modest_turns - before, args.max_new_tokens)
    return {"alone": phase_figures(alone), "loaded": {**phase_figures(loaded), "wall_s": loaded_s},
            "greedy": load.figures()}


class LongPrompts:
    """Prompts of about `tokens` tokens (the model's tokenizer), each different from its first words (no
    prefix of one is another's)."""

    def __init__(self, tokens: int):
        from compute_node.model_loader import load_tokenizer
        self.tokenizer = load_tokenizer(ComputeSettings().model_cache_dir)
        self.tokens, self.made = tokens, 0

    def next(self) -> str:
        self.made += 1
        words = [LONG_WORDS[(self.made * 7 + i * i) % len(LONG_WORDS)] for i in range(self.tokens)]
        text = f"Document {self.made}-{time.time_ns()}: " + " ".join(words)
        ids = self.tokenizer.encode(text, add_special_tokens=False)[:self.tokens]
        return self.tokenizer.decode(ids) + "\nSummarize it."


def prefill_rate(turns: list[Turn], began: float) -> float | None:
    """Prompt tokens of the served turns over the time from `began` to the last one's end (tokens/s)."""
    served = [t for t in turns if t.status == "ok"]
    if not served or max(t.done_s for t in served) <= began:
        return None
    return sum(t.prompt_tokens for t in served) / (max(t.done_s for t in served) - began)


async def measure_long(frontend: str, args: argparse.Namespace, tokens: dict[str, str]) -> dict:
    """Issue 42's load: {alone, loaded, greedy, long}; the long prompts alone, then beside the modest turns."""
    prompts = LongPrompts(args.long_prompt_tokens)
    hog, k = tokens[GREEDY], args.long_alone_prompts
    async with grpc.aio.insecure_channel(frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        await modest_phase(stub, tokens[MODEST], WARM_UP_TURNS, args.max_new_tokens)
        before = -(-args.modest_turns // 2)
        alone = await modest_phase(stub, tokens[MODEST], before, args.max_new_tokens)
        began = time.perf_counter()  # the long prompts alone, as many at once as beside
        sent = [one_turn(stub, hog, prompts.next(), args.greedy_max_new_tokens) for _ in range(k)]
        alone_long = [t for t, _ in await asyncio.gather(*sent)]
        alone_rate = prefill_rate(alone_long, began)
        began = time.perf_counter()
        tasks = [asyncio.create_task(one_turn(stub, hog, prompts.next(), args.greedy_max_new_tokens))
                 for _ in range(args.greedy_streams)]
        loaded = []
        try:
            await asyncio.sleep(args.settle_s)  # the frontend admitted the first of them

            def served() -> list[Turn]:
                ok = [t.result()[0] for t in tasks if t.done() and t.result()[0].status == "ok"]
                return sorted(ok, key=lambda t: t.done_s)[:k]

            def waiting() -> bool:  # for the first k long prompts, while k of them may still be served
                return len(served()) < k <= len(served()) + sum(not t.done() for t in tasks)
            while time.perf_counter() - began < MAX_LOADED_S and (len(loaded) < args.modest_turns or waiting()):
                loaded += await modest_phase(stub, tokens[MODEST], 1, args.max_new_tokens)
            loaded_s = time.perf_counter() - began
            done = served()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        beside_rate = prefill_rate(done, began) if len(done) == k else None
        await asyncio.sleep(args.settle_s)  # the long turns cancelled
        alone += await modest_phase(stub, tokens[MODEST], args.modest_turns - before, args.max_new_tokens)
    return {"alone": phase_figures(alone), "loaded": {**phase_figures(loaded), "wall_s": loaded_s},
            "greedy": {"streams": args.greedy_streams, "served": len(done), "refused": {}},
            "long": {"prompts": k, "prompt_tokens": [t.prompt_tokens for t in alone_long + done],
                     "alone_tokens_per_s": alone_rate, "beside_tokens_per_s": beside_rate}}


def frontend_settings(args: argparse.Namespace) -> dict:
    defaults = FrontendSettings()
    return {"max_concurrent_turns": args.max_concurrent_turns, "max_waiting_turns": args.max_waiting_turns,
            "queue_timeout_s": defaults.queue_timeout_s,
            "user_max_concurrent_turns": args.user_max_concurrent_turns,
            "user_max_waiting_turns": args.user_max_waiting_turns,
            "user_max_queued_prompt_tokens": args.user_max_queued_prompt_tokens}


def run(args: argparse.Namespace) -> dict:
    settings = {"greedy_streams": args.greedy_streams, "modest_turns": args.modest_turns,
                "long_prompt_tokens": args.long_prompt_tokens, "long_alone_prompts": args.long_alone_prompts,
                "step_target_s": args.step_target_s,
                "max_new_tokens": args.max_new_tokens, "greedy_max_new_tokens": args.greedy_max_new_tokens,
                "settle_s": args.settle_s, "torch_threads": args.torch_threads, "smoke": args.smoke,
                "frontend": frontend_settings(args)}
    result = new_result("fairness", settings)
    # the long prompts must fit the context: 8192 (the compute node's default) holds ~7k-token prompts
    context = max(1024, args.long_prompt_tokens + args.greedy_max_new_tokens + 256)
    # a long prompt beside the modest user's turns may take longer than the frontend's stock deadline (300 s)
    frontend = {**frontend_settings(args), **({"agent_timeout_s": MAX_LOADED_S} if args.long_prompt_tokens else {})}
    config = bench_config(users=2, max_new_tokens=args.max_new_tokens, max_context_tokens=context,
                          compute={"torch_threads": args.torch_threads, "step_target_s": args.step_target_s},
                          frontend=frontend)
    try:
        with Stack(services_dir(args, "fairness"), config, keep_data=args.keep_data) as stack:
            tokens = {user: stack.token(user) for user in (GREEDY, MODEST)}
            how = measure_long if args.long_prompt_tokens else measure
            result["results"].update(asyncio.run(how(stack.frontend, args, tokens)))
    except Exception as exc:  # noqa: BLE001 - a failed run is reported with its error
        fail(result, "fairness", exc)
    add_ratios(result)
    return result


def table(result: dict) -> str:
    r, s = result["results"], result["settings"]
    head = ["modest user", "served", "client TTFT p50", "client TTFT p99", "frontend TTFT p50", "e2e p50"]
    rows = []
    beside = f"beside {s['greedy_streams']} greedy streams"
    if s.get("long_prompt_tokens"):
        beside = f"beside {s['greedy_streams']} prompts of ~{s['long_prompt_tokens']} tokens"
    for phase, label in (("alone", "alone"), ("loaded", beside)):
        f = r.get(phase)
        if not f:
            continue
        times = [f"{f[k]['p50']:.0f}" if k in f else "-" for k in ("client_ttft_ms",)] + \
            [f"{f['client_ttft_ms']['p99']:.0f}" if "client_ttft_ms" in f else "-"] + \
            [f"{f[k]['p50']:.0f}" if k in f else "-" for k in ("ttft_ms", "e2e_ms")]
        rows.append([label, f"{f['served']}/{f['attempted']}", *times])
    greedy = r.get("greedy") or {}
    fe = s["frontend"]
    quotas = ", ".join(f"{k.removeprefix('user_max_')} {fe[k]}" for k in
                       ("user_max_concurrent_turns", "user_max_waiting_turns", "user_max_queued_prompt_tokens")
                       if fe[k]) or "none"
    return (f"times in ms; the frontend's places: {fe['max_concurrent_turns']} running, "
            f"{fe['max_waiting_turns']} waiting, shared fairly (work-conserving); quotas per user: {quotas}\n"
            f"{format_table(head, rows)}\n"
            f"greedy user: {greedy.get('served', 0)} turns served, refused {greedy.get('refused', {})}\n"
            f"{long_text(r.get('long'), s)}\n"
            f"{ratios_text(result['ratios'])}")


def long_text(long: dict | None, s: dict) -> str:
    """The long prompts' prefill rate alone and beside the modest user, and the step target (long mode)."""
    if not long:
        return ""

    def rate(v):
        return f"{v:.0f}" if v else "-"
    return (f"long prompts (step_target_s {s.get('step_target_s')}): {long['prompts']} at once, prefill tokens/s "
            f"alone {rate(long.get('alone_tokens_per_s'))}, beside the modest user "
            f"{rate(long.get('beside_tokens_per_s'))}; prompt tokens {long.get('prompt_tokens')}\n")


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
