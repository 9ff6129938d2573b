"""`kvtb bench fairness`: a modest user's turns alone and beside a greedy user holding many streams.

Every service runs as a process (`kvtb up`'s wiring, bench.stack) with the real model and the
frontend's admission settings as a deployment has them (its defaults, unless given). The modest
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
from kvtb_proto import frontend_pb2, frontend_pb2_grpc

logger = logging.getLogger(__name__)

GREEDY, MODEST = "u0", "u1"
QUESTIONS = ("What is a storage node?", "What does a SmartNIC do?", "What is a KV cache?",
             "Why offload KV to storage?", "What is a queue pair?", "What is a trigger counter?")
FLOORS = {"modest_served_loaded": 1.0}                 # every modest turn served under the load
CEILINGS = {"modest_ttft_p50_loaded_vs_alone": 2.0}    # issue 31's target
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
    if args.greedy_streams < 1 or args.modest_turns < 1:
        parser.error("--greedy-streams and --modest-turns must be at least 1")
    return args


@dataclasses.dataclass
class Turn:
    """One turn as a client saw it: served or its status, and its times (ms)."""

    status: str                 # "ok" or the gRPC status name
    client_ttft_ms: float = 0.0  # request sent to the first text
    ttft_ms: float = 0.0         # the frontend's (its turn summary)
    e2e_ms: float = 0.0


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
    result["floors"] = floors(result["ratios"], FLOORS, CEILINGS)


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
                return Turn("ok", client_ttft, s.ttft_ms, s.e2e_ms), None
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


def frontend_settings(args: argparse.Namespace) -> dict:
    defaults = FrontendSettings()
    return {"max_concurrent_turns": args.max_concurrent_turns, "max_waiting_turns": args.max_waiting_turns,
            "queue_timeout_s": defaults.queue_timeout_s,
            "user_max_concurrent_turns": args.user_max_concurrent_turns,
            "user_max_waiting_turns": args.user_max_waiting_turns,
            "user_max_queued_prompt_tokens": args.user_max_queued_prompt_tokens}


def run(args: argparse.Namespace) -> dict:
    settings = {"greedy_streams": args.greedy_streams, "modest_turns": args.modest_turns,
                "max_new_tokens": args.max_new_tokens, "greedy_max_new_tokens": args.greedy_max_new_tokens,
                "settle_s": args.settle_s, "torch_threads": args.torch_threads, "smoke": args.smoke,
                "frontend": frontend_settings(args)}
    result = new_result("fairness", settings)
    config = bench_config(users=2, max_new_tokens=args.max_new_tokens, max_context_tokens=1024,
                          compute={"torch_threads": args.torch_threads}, frontend=frontend_settings(args))
    try:
        with Stack(services_dir(args, "fairness"), config, keep_data=args.keep_data) as stack:
            tokens = {user: stack.token(user) for user in (GREEDY, MODEST)}
            result["results"].update(asyncio.run(measure(stack.frontend, args, tokens)))
    except Exception as exc:  # noqa: BLE001 - a failed run is reported with its error
        fail(result, "fairness", exc)
    add_ratios(result)
    return result


def table(result: dict) -> str:
    r, s = result["results"], result["settings"]
    head = ["modest user", "served", "client TTFT p50", "client TTFT p99", "frontend TTFT p50", "e2e p50"]
    rows = []
    for phase, label in (("alone", "alone"), ("loaded", f"beside {s['greedy_streams']} greedy streams")):
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
            f"greedy user: {greedy.get('served', 0)} turns served, refused {greedy.get('refused', {})}\n\n"
            f"{ratios_text(result['ratios'])}")


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
