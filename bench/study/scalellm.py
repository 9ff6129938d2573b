"""`kvtb study scalellm`: ScaleLLM's Table 1, Fig. 6 and Fig. 7 through the frontend's OpenAI HTTP API.

ScaleLLM (../shared/papers/scalellm-paper.txt, §5) drives an endpoint with c concurrent clients,
each sending OpenAI-format requests back to back, 20 x c requests per level, c = 1 .. 64 (and up
to 256), and measures:

- Table 1: TTFT and TBT of streamed requests; a request not finished within 60 s is a timeout;
- Fig. 6: the average latency split into engine latency (the engine's own inference) and gateway
  latency (everything else between the user and the engine: e2e minus engine);
- Fig. 7: output throughput, the tokens the whole system generates over the level's wall time
  (from the common start to the end of the last request).

Here: every service as a process (`kvtb up`'s wiring, bench.stack), c client coroutines on one
aiohttp session, each sending its share of the level's requests back to back through
POST /v1/chat/completions with `stream: true` and `stream_options.include_usage`, greedy. TTFT,
TBT and e2e are the client's own clocks (TBT: (e2e - TTFT) / (completion tokens - 1), ScaleLLM's
average wait per token after the first). A request still unfinished `--timeout-s` after it was
sent is abandoned (the client closes the stream; the frontend cancels the turn) and counted as a
timeout; a refused or broken one is counted as an error: neither is dropped.

The HTTP response does not carry the engine's time (only the usage chunk and X-Session-Id), so
after each level the study asks the frontend over gRPC (GetContext, as the user) for each completed
request's stored turn summary: its `engine_ms` is the compute node's time for the turn (from its
arrival at the compute node, its scheduler's queue included, to its last token) and its
`gateway_ms` the frontend's e2e minus that (admission, the agent, streaming back). The client's e2e
minus engine_ms is reported too: ScaleLLM's gateway latency seen from the user, the HTTP client's
share (this process, on the same cores) included. Throughput is counted twice: the completed
requests' completion tokens, and every token the compute node generated during the level (its
Stats counter, timed-out requests' tokens included: ScaleLLM's N_t), which Fig. 7 uses.

With `--replicas 1 2` (ScaleLLM's Fig. 8 question: replica parallelism against one replica), each
replica count gets a stack of its own (`kvtb up --replicas N`: N agent and compute node pairs behind
one frontend routing by `--routing`) and the same levels; bench.study.scalellm_replicas sets the
counts side by side. The default, one replica, is the study as it always was.

The per-level figures are pure functions of the requests' records (`level_figures`), the claims
pure functions of those (`add_claims`), so that they can be tested on hand-made numbers.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.openai_client import ChatFailed, ChatTimedOut, Message, chat, messages_of, model_name
from bench.progress import Progress
from bench.results import data_dir, plot_lines, progress_for
from bench.stack import Stack, bench_config, bench_users
from bench.stats import mean, percentile, ratio
from bench import scaled
from bench.study.report import add_study_args, check_profile, claim, main_of, new_study, run_part, unmeasured
from bench.study.scalellm_replicas import (
    add_replica_claims,
    add_replica_ratios,
    draw_replicas,
    placements_text,
    replica_table,
    replicas_text,
)
from chat_frontend.settings import FrontendSettings

logger = logging.getLogger(__name__)

NAME = "scalellm"
LEVELS = (1, 2, 4, 8, 16, 32, 64)
QUICK_LEVELS = (1, 4, 16, 64)
SMOKE_LEVELS = (1, 2)
REQUESTS_PER_CLIENT = {"full": 20, "quick": 2, "smoke": 1}   # ScaleLLM: 20 x c requests per level
MAX_TOKENS = {"full": 32, "quick": 32, "smoke": 4}
TIMEOUT_S = 60.0      # ScaleLLM's user waiting threshold
MAX_NUM_SEQS = 32     # the compute node's batch bound (its default): past it requests queue there
ROUTINGS = ("least_loaded", "kv_aware", "round_robin")   # the frontend's `routing` (chat_frontend.routing)
MAX_REPLICAS = 8
FRONTEND_PLACES = FrontendSettings().max_concurrent_turns  # turns forwarded at once; the agent's relay holds no thread
PAPER = ("ScaleLLM measured Mixtral 8x7B on NVIDIA H100 GPUs (TensorRT-LLM, vLLM and HuggingFace "
         "engines behind a FastAPI or a Rust gateway, 512 tokens per reply)")

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


def gateway_why(shares: Mapping[int, float], high: int, agrees: bool, profile: str = "") -> str:
    """Why the gateway's share of the latency is what it is at the highest level (Fig. 6's claim)."""
    low = min(shares)
    if profile and not agrees:
        return (f"under `{profile}` the engine is the profile's GPU running its virtual model and the gateway "
                f"runs at its real speed (its CPU time x D): its share grows ({shares[low]:.1%} at {low}, "
                f"{shares[high]:.1%} at {high}) but stays under half; ScaleLLM's gateway fell behind an H100 "
                "engine streaming 512-token replies, and these replies are shorter; ")
    if agrees:
        return ("the frontend, agent and clients share the CPU cores with the engine, so at high "
                "concurrency their work queues behind its forwards; ")
    if high > FRONTEND_PLACES and shares[high] >= 0.2 and shares[high] > 4 * shares[low]:
        return (f"the share grows ({shares[low]:.1%} at {low}, {shares[high]:.1%} at {high}), but not because "
                f"the gateway's own work grows: the frontend forwards at most {FRONTEND_PLACES} turns at once "
                f"(setting max_concurrent_turns), so at {high} concurrent the turns past it wait there, outside "
                f"the engine, and that wait counts as gateway time; ")
    return ("the gateway became ScaleLLM's bottleneck only beside an H100 engine generating hundreds of "
            "tokens per second per request; our CPU engine is some hundred times slower per token, so a "
            "Python gateway keeps up and the engine (its queue) stays the bottleneck; ")


def prompt_of(i: int) -> list[Message]:
    """The messages of request i: a system prompt and one chat-style question, len(STEMS) *
    len(TOPICS) distinct ones (i and i + 1 always differ, so a client's requests never repeat)."""
    stem = STEMS[i % len(STEMS)]
    topic = TOPICS[(i // len(STEMS)) % len(TOPICS)]
    return messages_of(SYSTEM, [], stem.format(topic))


# -- options ------------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb study scalellm", description=__doc__.splitlines()[0])
    add_study_args(parser, NAME)
    parser.add_argument("--levels", type=int, nargs="+",
                        help=f"concurrent clients per level (default {LEVELS}; --quick {QUICK_LEVELS}; "
                             f"--smoke {SMOKE_LEVELS})")
    parser.add_argument("--requests-per-client", type=int,
                        help="requests each client sends back to back, so c x this per level (default 20 as "
                             "ScaleLLM's 20 x c; --quick 2; --smoke 1)")
    parser.add_argument("--max-tokens", type=int,
                        help="max_tokens of every request (default 32, as --quick; --smoke 4; ScaleLLM: 512)")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S,
                        help="a request unfinished this long after it was sent is a timeout "
                             "(default 60, ScaleLLM's)")
    parser.add_argument("--policy", default="triggered",
                        help="the deployment's KV policy (default triggered, the product's)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the compute node's torch threads (default 0: its default, all cores)")
    parser.add_argument("--pool-tokens", type=int, default=32768,
                        help="the compute node's KV pool in tokens (default 32768: 64 requests fit)")
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
    if any(c < 1 for c in args.levels):
        parser.error("every level needs at least one client")
    if args.requests_per_client < 1 or args.max_tokens < 1 or args.timeout_s <= 0:
        parser.error("--requests-per-client and --max-tokens must be at least 1, --timeout-s positive")
    if any(n < 1 or n > MAX_REPLICAS for n in args.replicas):
        parser.error(f"--replicas: every count must be 1 .. {MAX_REPLICAS}")
    args.levels = sorted(set(args.levels))
    args.replicas = sorted(set(args.replicas))
    args.profile_obj = check_profile(parser, args, NAME)
    args.dilation = 1.0   # D, once chosen (run_levels)
    return args


# -- one request's record and a level's figures (pure) -------------------------------------------------

@dataclasses.dataclass
class RequestRecord:
    """One request as its client saw it; engine figures from the frontend's turn summary when found."""

    client: int
    status: str                     # "ok", "timeout" or "error"
    e2e_s: float                    # from sending to the end of the stream (or to giving up)
    ttft_s: float | None = None     # first text (a timed-out request's too, if it came)
    tokens: int = 0                 # completion tokens (usage), ok requests only
    prompt_tokens: int = 0
    error: str = ""
    user: str = ""
    session_id: str = ""
    engine_ms: float | None = None          # the compute node's time (summary.engine_ms)
    frontend_e2e_ms: float | None = None    # the frontend's e2e (summary.e2e_ms)
    gateway_ms: float | None = None         # summary.gateway_ms: frontend e2e - engine
    replica: str = ""                       # summary.replica: the replica the frontend routed it to


def tbt_s(record: RequestRecord) -> float | None:
    """ScaleLLM's TBT of one request: its average wait per token after the first; None under 2 tokens."""
    if record.status != "ok" or record.tokens < 2 or record.ttft_s is None:
        return None
    return (record.e2e_s - record.ttft_s) / (record.tokens - 1)


def in_virtual_time(records: Sequence[RequestRecord], wall_s: float,
                    dilation: float) -> tuple[list[RequestRecord], float]:
    """Under a hardware profile: the records and the level's wall time in virtual time (every time / D).
    The clients' clocks and the services' (the turn summaries' ms) are wall clocks of a run dilated D x."""
    if dilation == 1.0:
        return list(records), wall_s

    def v(x):
        return None if x is None else x / dilation
    return ([dataclasses.replace(r, e2e_s=r.e2e_s / dilation, ttft_s=v(r.ttft_s), engine_ms=v(r.engine_ms),
                                 frontend_e2e_ms=v(r.frontend_e2e_ms), gateway_ms=v(r.gateway_ms))
             for r in records], wall_s / dilation)


def classify(record: RequestRecord, timeout_s: float) -> str:
    """ok, timeout or error; a request that ended after the timeout is a timeout even if it completed."""
    if record.status == "ok" and record.e2e_s > timeout_s:
        return "timeout"
    return record.status


def _p(values: Sequence[float]) -> dict[str, float] | None:
    """{n, mean, p50, p99} in ms of values in seconds; None without values."""
    if not values:
        return None
    ms = [v * 1e3 for v in values]
    return {"n": len(ms), "mean": mean(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99),
            "max": max(ms)}


def level_figures(records: Sequence[RequestRecord], wall_s: float, timeout_s: float) -> dict[str, Any]:
    """One level's Table 1, Fig. 6 and Fig. 7 figures from its requests' records.

    Latencies are over the completed requests; timeouts and errors are counted beside them.
    Throughput is the completed requests' tokens over the level's wall time (ScaleLLM's N_t /
    (T1 - T0)). Engine and gateway means are over the completed requests whose summary was found
    (`summaries` says how many)."""
    if wall_s <= 0:
        raise ValueError(f"a level's wall time must be positive, not {wall_s}")
    status = collections.Counter(classify(r, timeout_s) for r in records)
    ok = [r for r in records if classify(r, timeout_s) == "ok"]
    tbts = [t for t in map(tbt_s, ok) if t is not None]
    tokens = sum(r.tokens for r in ok)
    with_engine = [r for r in ok if r.engine_ms is not None]
    engine = mean([r.engine_ms for r in with_engine]) if with_engine else None
    gateway = mean([r.gateway_ms for r in with_engine]) if with_engine else None
    client_e2e = mean([r.e2e_s * 1e3 for r in with_engine]) if with_engine else None
    frontend_e2e = mean([r.frontend_e2e_ms for r in with_engine]) if with_engine else None
    errors = [r.error for r in records if classify(r, timeout_s) == "error"]
    return {
        "requests": len(records), "completed": len(ok),
        "timeouts": status["timeout"], "errors": status["error"],
        "timeout_share": ratio(status["timeout"], len(records)) if records else 0.0,
        "error_examples": sorted(set(errors))[:3],
        "wall_s": wall_s,
        "ttft_ms": _p([r.ttft_s for r in ok if r.ttft_s is not None]),
        # every request but the errors, a timed-out one without its first text counted at its timeout
        # (a lower bound): TTFT as the waiting users saw it
        "ttft_ms_incl_timeouts": _p([r.ttft_s if r.ttft_s is not None else r.e2e_s for r in records
                                     if classify(r, timeout_s) != "error"]),
        "timeouts_with_first_text": sum(1 for r in records if classify(r, timeout_s) == "timeout"
                                        and r.ttft_s is not None and r.ttft_s <= timeout_s),
        "tbt_ms": _p(tbts),
        "e2e_ms": _p([r.e2e_s for r in ok]),
        "output_tokens": tokens, "output_tokens_per_s": tokens / wall_s,
        "prompt_tokens_mean": mean([r.prompt_tokens for r in ok]) if ok else None,
        "summaries": len(with_engine),
        # completed requests by the replica that served them (their summaries'): how routing spread them
        "by_replica": dict(sorted(collections.Counter(r.replica for r in with_engine if r.replica).items())),
        "engine_ms_mean": engine,
        "gateway_ms_mean": gateway,                      # frontend e2e - engine (the turn summary's split)
        "client_gateway_ms_mean": None if engine is None else client_e2e - engine,  # client e2e - engine
        "client_side_ms_mean": None if frontend_e2e is None else client_e2e - frontend_e2e,
        "gateway_share": None if engine is None else ratio(gateway, gateway + engine),
        "client_gateway_share": None if engine is None else ratio(client_e2e - engine, client_e2e),
    }


def measured_levels(study: dict) -> dict[int, dict]:
    """The levels that ran, by concurrency (failed ones left to `failed`)."""
    return {int(c): f for c, f in study["results"].get("levels", {}).items() if "failed" not in f}


def _v(f: dict, key: str, stat: str = "p50") -> float | None:
    value = f.get(key)
    return value.get(stat) if isinstance(value, dict) else value


def add_ratios(study: dict) -> None:
    """Every level against one client, measured in the same run."""
    levels = measured_levels(study)
    r = study["ratios"]
    for c, f in sorted(levels.items()):
        r[f"timeouts_{c}"] = f["timeouts"]
        if f.get("gateway_share") is not None:
            r[f"gateway_share_{c}"] = f["gateway_share"]
    if 1 not in levels:
        return
    base = levels[1]
    for c, f in sorted(levels.items()):
        if c == 1:
            continue
        r[f"tokens_per_s_{c}_vs_1"] = ratio(throughput(f)[0], throughput(base)[0])
        r[f"completed_tokens_per_s_{c}_vs_1"] = ratio(f["output_tokens_per_s"], base["output_tokens_per_s"])
        for name, of in (("ttft", _ttft), ("tbt", lambda level: level["tbt_ms"])):  # TTFT as users saw it
            a, b = of(f), of(base)
            for stat in ("p50", "p99"):
                if a and b and b[stat]:
                    r[f"{name}_{stat}_{c}_vs_1"] = a[stat] / b[stat]
        if f.get("engine_ms_mean") and base.get("engine_ms_mean"):
            r[f"engine_ms_{c}_vs_1"] = f["engine_ms_mean"] / base["engine_ms_mean"]


# -- the claims (pure: from the study's levels) -------------------------------------------------------

def _ttft(f: dict) -> dict | None:
    """A level's TTFT as its users saw it: timed-out requests included (ttft_ms over the completed ones
    where that figure is absent)."""
    return f.get("ttft_ms_incl_timeouts", f.get("ttft_ms"))


def throughput(f: dict) -> tuple[float, str]:
    """A level's throughput for Fig. 7: every token the compute node generated over the wall time when
    its counters answered (ScaleLLM's N_t / (T1 - T0)), else the completed requests' tokens."""
    if f.get("generated_tokens_per_s") is not None:
        return f["generated_tokens_per_s"], "generated"
    return f["output_tokens_per_s"], "completed"


def _steps(values: Sequence[float]) -> list[float]:
    return [ratio(b, a) for a, b in zip(values, values[1:])]


def _x(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def add_claims(study: dict) -> None:
    """The seed's claims of Table 1, Fig. 6 and Fig. 7 beside this run's figures."""
    levels = measured_levels(study)
    xs = sorted(levels)
    settings = study["settings"]
    why_scale = (f"ScaleLLM: Mixtral 8x7B on H100 GPUs; here {settings['model']} on "
                 f"{study['machine'].get('cores')} CPU cores shared with every service and the client, so "
                 "shapes and ratios compare, absolute numbers do not")
    if settings.get("profile"):
        why_scale = (f"ScaleLLM: Mixtral 8x7B on H100 GPUs; here, under the hardware profile `{settings['profile']}`, "
                     f"{settings['model']} computes the tokens while every step is charged as the profile's GPU "
                     "running its virtual model, in virtual time; the gateway runs at its real speed")
    missing = unmeasured(study, study["failed"][0]["part"] if study["failed"] else "services")
    top = xs[-1] if xs else None
    have_base = len(xs) >= 2 and xs[0] == 1
    ttfts = {c: _ttft(levels[c]) for c in xs}
    tbts = {c: levels[c]["tbt_ms"] for c in xs}

    # Table 1: TTFT
    text = ("TTFT grows with concurrency, most sharply at the highest level: vLLM 48 -> 285 ms from 1 to 64 "
            "(5.9x), ScaleLLM 25 -> 99 ms (4.0x, of which 3.3x between 32 and 64)")
    if have_base and all(ttfts.values()):
        p50 = [ttfts[c]["p50"] for c in xs]
        p99 = [ttfts[c]["p99"] for c in xs]
        steps = _steps(p50)
        grows = p50[-1] / p50[0] >= 2.0
        sharpest_last = steps[-1] >= max(steps) * 0.999
        measured = (f"TTFT p50 {p50[0]:.0f} ms at 1 -> {p50[-1]:.0f} ms at {top} ({p50[-1] / p50[0]:.1f}x); "
                    f"p99 {p99[0]:.0f} -> {p99[-1]:.0f} ms; p50 step per level "
                    + ", ".join(f"{a}->{b}: {_x(s)}" for a, b, s in zip(xs, xs[1:], steps))
                    + ("; timed-out requests included (at their first text, or at the timeout if none came)"
                       if any(levels[c]["timeouts"] for c in xs) else ""))
        claim(study, "Table 1", text, measured, grows and sharpest_last,
              f"requests past the compute node's {MAX_NUM_SEQS} batched sequences wait in its queue for a "
              f"whole reply, so TTFT jumps once the level exceeds {MAX_NUM_SEQS}"
              + ("" if top > MAX_NUM_SEQS else f" (no level above {MAX_NUM_SEQS} was measured here)")
              + f"; {why_scale}")
    elif have_base:
        claim(study, "Table 1", text, "no request got an answer at " + ", ".join(
            str(c) for c in xs if not ttfts[c]) + " concurrent (every one failed)", None, why_scale)
    else:
        claim(study, "Table 1", text, missing, None, why_scale)

    # Table 1: TBT
    text = ("TBT grows with concurrency, far less than TTFT: vLLM 16.5 -> 70.8 ms from 1 to 64 (4.3x), "
            "ScaleLLM 8.5 -> 16.5 ms (1.9x)")
    if have_base and tbts[1] and tbts[top] and ttfts[1] and ttfts[top]:
        t_ratio = tbts[top]["p50"] / tbts[1]["p50"]
        f_ratio = ttfts[top]["p50"] / ttfts[1]["p50"]
        measured = (f"TBT p50 {tbts[1]['p50']:.1f} ms at 1 -> {tbts[top]['p50']:.1f} ms at {top} "
                    f"({t_ratio:.1f}x; "
                    f"TTFT {f_ratio:.1f}x); p99 {tbts[1]['p99']:.1f} -> {tbts[top]['p99']:.1f} ms")
        claim(study, "Table 1", text, measured, t_ratio > 1.0 and t_ratio < f_ratio,
              "each decode step carries every running sequence, so it lengthens with the batch up to "
              f"{MAX_NUM_SEQS} sequences and no further, while queued requests add to TTFT only; on a CPU "
              f"a step's cost grows with the batch much sooner than on a GPU; {why_scale}")
    elif have_base:
        claim(study, "Table 1", text, "no request completed at " + ", ".join(
            str(c) for c in (1, top) if not tbts[c]) + " concurrent (all timed out or failed)",
              None, why_scale)
    else:
        claim(study, "Table 1", text, missing, None, why_scale)

    # Table 1: timeouts
    text = ("With a continuous-batching engine (vLLM, ScaleLLM) no request times out at 60 s up to 64 "
            "concurrent; without one (HuggingFace) over 90% time out from 8")
    if xs:
        timeouts = {c: levels[c]["timeouts"] for c in xs}
        total = {c: levels[c]["requests"] for c in xs}
        first = next((c for c in xs if timeouts[c]), None)
        slowest = {c: levels[c]["e2e_ms"]["max"] / 1e3 for c in xs if levels[c]["e2e_ms"]}
        measured = ("timeouts (of requests): " + ", ".join(f"{c}: {timeouts[c]}/{total[c]}" for c in xs)
                    + (f"; first at {first} concurrent" if first else "; none")
                    + (f"; slowest completed request at {top}: {slowest[top]:.1f} s"
                       if top in slowest else ""))
        timeout_s, max_tokens = settings["timeout_s"], settings["max_tokens"]
        load = study["machine"].get("load_average_1m") or 0.0
        if first is None:
            why = (f"the compute node batches continuously too, so every request keeps making progress; "
                   f"replies of {max_tokens} tokens (ScaleLLM: 512) keep a level's wait for queued replies "
                   f"under {timeout_s:g} s")
        elif first > MAX_NUM_SEQS:
            why = (f"our engine batches continuously, but a CPU generates some hundred times fewer tokens "
                   f"per second than an H100, so at {first} concurrent the requests queued past the "
                   f"{MAX_NUM_SEQS} batched ones wait for whole replies of up to {max_tokens} tokens and "
                   f"pass {timeout_s:g} s")
        else:
            why = (f"at {first} concurrent all {first} requests are in the batch, yet {max_tokens} tokens "
                   f"each took the CPU engine over {timeout_s:g} s: its batched steps are that slow on "
                   f"these cores (load average {load:.1f} as the run began, others' processes included)")
        claim(study, "Table 1", text, measured, first is None, f"{why}; {why_scale}")
    else:
        claim(study, "Table 1", text, missing, None, why_scale)

    # Fig. 6: engine dominates at low concurrency; the gateway becomes the bottleneck at high
    shares = {c: levels[c]["gateway_share"] for c in xs if levels[c].get("gateway_share") is not None}
    text = "At low concurrency (4) engine latency is the primary bottleneck, not the gateway"
    why6 = ("engine latency is the compute node's time for the turn (its queue included), gateway latency "
            "the frontend's e2e minus that (admission, the SmartNIC agent, streaming back); ")
    if shares:
        low = min(shares)
        claim(study, "Fig. 2, Fig. 6", text,
              f"gateway share of the latency at {low} concurrent: {shares[low]:.1%} (engine "
              f"{levels[low]['engine_ms_mean']:.0f} ms, gateway {levels[low]['gateway_ms_mean']:.0f} ms)",
              shares[low] < 0.5,
              why6 + "a reply takes the engine " + (f"{levels[low]['engine_ms_mean']:.0f} ms (virtual)"
                                                    if settings.get("profile") else "seconds") + " here; "
              "the gateway's work per request (authentication, tokenization through the agent, a few HTTP "
              "chunks) does not grow with it; " + why_scale)
    else:
        claim(study, "Fig. 2, Fig. 6", text,
              missing if not xs else "no turn summaries were found for any level", None, why_scale)
    text = ("At high concurrency (64 to 256) the baseline (Python) gateway's latency grows until it is the "
            "bottleneck when paired with a fast engine")
    if len(shares) >= 2:
        low, high = min(shares), max(shares)
        grows = shares[high] > shares[low]
        measured = ("gateway share " + ", ".join(f"{c}: {s:.1%}" for c, s in sorted(shares.items()))
                    + f"; gateway mean {levels[low]['gateway_ms_mean']:.0f} ms at {low} -> "
                      f"{levels[high]['gateway_ms_mean']:.0f} ms at {high}, engine "
                      f"{levels[low]['engine_ms_mean']:.0f} -> {levels[high]['engine_ms_mean']:.0f} ms")
        client = levels[high].get("client_gateway_share")
        if client is not None:
            measured += f"; seen from the client (client e2e - engine): {client:.1%} at {high}"
        agrees = grows and shares[high] >= 0.5
        claim(study, "Fig. 6", text, measured, agrees, why6 + gateway_why(shares, high, agrees, settings.get("profile", "")) + why_scale)
    else:
        claim(study, "Fig. 6", text, missing if len(xs) < 2 else "fewer than two levels with turn summaries",
              None, why_scale)

    # Fig. 7: throughput grows with concurrency, then flattens
    text = ("Output throughput grows with concurrency (Fig. 7, 1 to 256 concurrent), the gains shrinking as "
            "the engine fills")
    if len(xs) >= 2:
        tps = [throughput(levels[c])[0] for c in xs]
        kinds = {throughput(levels[c])[1] for c in xs}
        steps = _steps(tps)
        grows = tps[-1] > tps[0] * 1.5 and all(s > 0.9 for s in steps)
        flattens = steps[-1] < max(steps[:-1]) if len(steps) >= 2 else True  # two levels: growth only
        measured = (f"{tps[0]:.1f} tokens/s at {xs[0]} -> {tps[-1]:.1f} at {top} "
                    f"({ratio(tps[-1], tps[0]):.1f}x); "
                    "gain per level "
                    + ", ".join(f"{a}->{b}: {_x(s)}" for a, b, s in zip(xs, xs[1:], steps))
                    + ("; tokens the compute node generated" if kinds == {"generated"} else
                       "; tokens of completed requests (the compute node's counters did not answer at "
                       "every level)")
                    + ("; two levels show growth only, not its flattening" if len(steps) < 2 else "")
                    + "; completed requests' tokens/s "
                    + ", ".join(f"{c}: {levels[c]['output_tokens_per_s']:.1f}" for c in xs))
        claim(study, "Fig. 7", text, measured, grows and flattens,
              f"continuous batching shares each forward among up to {MAX_NUM_SEQS} sequences, so throughput "
              f"rises with the batch until the cores are busy; past {MAX_NUM_SEQS} the rest only queue"
              + ("" if grows and flattens else
                 "; requests that time out add no tokens, and on 2 shared cores the gain per level is noisy")
              + "; " + why_scale)
    else:
        claim(study, "Fig. 7", text, missing, None, why_scale)


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
    levels = measured_levels(study)
    asked = sorted(int(c) for c in study.get("settings", {}).get("levels", [])) or sorted(levels)
    top = asked[-1] if asked else None
    rows = []
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
        ta, tb = _ttft(a), _ttft(b)
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

    rows.append({"question": f"Output tokens/s, {top} concurrent / 1 (ScaleLLM Fig. 7)",
                 "measured": measured(tokens),
                 "target": "ScaleLLM: throughput grows with concurrency, then flattens"})
    rows.append({"question": f"TTFT p50, {top} concurrent / 1, and timeouts at {top} (ScaleLLM Table 1)",
                 "measured": measured(ttft),
                 "target": "ScaleLLM: 4.0x (25 -> 99 ms), vLLM 5.9x; no timeouts at 64"})
    rows.append({"question": f"Gateway share of latency at {top} concurrent (ScaleLLM Fig. 6)",
                 "measured": measured(gateway),
                 "target": "ScaleLLM: the Python gateway becomes the bottleneck at 64-256 "
                           "beside a fast engine"})
    return rows


# -- running a level (I/O) ------------------------------------------------------------------------------

async def _client(session: aiohttp.ClientSession, base_url: str, model: str, token: str, user: str,
                  client: int,
                  prompts: Sequence[list[Message]], max_tokens: int, timeout_s: float,
                  done: Callable[[], None]) -> list[RequestRecord]:
    """One client: its requests back to back, each abandoned after timeout_s."""
    out = []
    for messages in prompts:
        start = time.perf_counter()
        try:
            reply = await chat(session, base_url, token, model, messages, max_tokens, timeout_s=timeout_s)
        except ChatTimedOut as exc:
            out.append(RequestRecord(client, "timeout", time.perf_counter() - start, ttft_s=exc.ttft_s,
                                     user=user, session_id=exc.session_id))
        except (ChatFailed, aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
            out.append(RequestRecord(client, "error", time.perf_counter() - start,
                                     error=f"{type(exc).__name__}: {exc}"[:300], user=user))
        else:
            out.append(RequestRecord(client, "ok", reply.e2e_s, ttft_s=reply.ttft_s,
                                     tokens=reply.completion_tokens, prompt_tokens=reply.prompt_tokens,
                                     user=user, session_id=reply.session_id))
        done()
    return out


async def run_clients(base_url: str, model: str, clients: Sequence[tuple[str, str]],
                      prompts: Sequence[Sequence[list[Message]]], max_tokens: int, timeout_s: float,
                      done: Callable[[], None]) -> tuple[list[RequestRecord], float]:
    """len(clients) clients ((user, token) each) at once, each through its prompts; every record and the
    wall time from the common start to the last request's end."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as session:
        begin = time.perf_counter()
        per_client = await asyncio.gather(*(
            _client(session, base_url, model, token, user, k, prompts[k], max_tokens, timeout_s, done)
            for k, (user, token) in enumerate(clients)))
        wall_s = time.perf_counter() - begin
    return [r for records in per_client for r in records], wall_s


def attach_summaries(frontend: str, records: Sequence[RequestRecord], tokens: Mapping[str, str]) -> int:
    """Each completed request's turn summary from the frontend (GetContext as its user): engine,
    gateway and e2e as the frontend split them. Returns how many were found."""
    from chat_client.client import FrontendClient, RpcFailure

    found = 0
    by_user: dict[str, list[RequestRecord]] = collections.defaultdict(list)
    for r in records:
        if r.status == "ok" and r.session_id:
            by_user[r.user].append(r)
    for user, mine in by_user.items():
        client = FrontendClient(frontend, tokens[user], timeout_s=30.0)
        try:
            for r in mine:
                try:
                    turns = client.get_context(r.session_id).turns
                except RpcFailure as exc:
                    logger.warning("no summary of %s's context %s: %s", user, r.session_id, exc)
                    continue
                if not turns or not turns[-1].HasField("summary"):
                    continue
                s = turns[-1].summary
                r.engine_ms, r.frontend_e2e_ms, r.gateway_ms = s.engine_ms, s.e2e_ms, s.gateway_ms
                r.replica = s.replica
                found += 1
        finally:
            client.close()
    return found


def run_level(stack: Stack, base_url: str, model: str, c: int, users: list[str], args,
              progress: Progress) -> dict:
    """c clients at once, args.requests_per_client requests each; the level's figures."""
    tokens = {u: stack.token(u) for u in users}
    n = args.requests_per_client
    prompts = [[prompt_of(k * n + j) for j in range(n)] for k in range(c)]
    before, cpu_before = compute_counters(stack), stack.cpu_seconds()
    records, wall_s = asyncio.run(run_clients(  # the timeout is virtual: D x it in wall time
        base_url, model, [(u, tokens[u]) for u in users], prompts, args.max_tokens, args.timeout_s * args.dilation,
        lambda: progress.update(note=f"{c} concurrent")))
    after, cpu_after = compute_counters(stack), stack.cpu_seconds()
    attach_summaries(stack.frontend, records, tokens)
    cpu_wall_s = wall_s
    records, wall_s = in_virtual_time(records, wall_s, args.dilation)
    figures = level_figures(records, wall_s, args.timeout_s)
    # the compute node's preemptions during the level (None when its Stats did not answer in time)
    figures["preemptions"] = None if before is None or after is None else {
        k: after["preemptions"][k] - before["preemptions"].get(k, 0) for k in after["preemptions"]}
    # every token the compute nodes generated during the level, timed-out requests' too (ScaleLLM's N_t)
    counted = before is not None and after is not None
    figures["generated_tokens"] = after["tokens_out"] - before["tokens_out"] if counted else None
    figures["generated_tokens_per_s"] = figures["generated_tokens"] / wall_s if counted else None
    # cores each process kept busy during the level ("client": this process, the clients)
    figures["cpu_cores"] = {name: (cpu_after[name] - cpu_before.get(name, 0.0)) / cpu_wall_s
                            for name in cpu_after}
    return figures


def compute_counters(stack: Stack) -> dict | None:
    """Every replica's compute node's tokens_out and preemptions (by kind), summed; None (with a warning)
    when one does not answer in time: a busy node's statistics must not cost the level's measurements."""
    import grpc

    tokens, preemptions = 0, collections.Counter()
    for i in range(stack.replicas):
        try:
            stats = stack.compute_stats(i, timeout_s=30)
        except grpc.RpcError as exc:
            logger.warning("replica %d's compute node's Stats did not answer: %s", i, exc.code())
            return None
        tokens += stats.tokens_out
        preemptions.update(dict(stats.preemptions))
    return {"tokens_out": tokens, "preemptions": dict(preemptions)}


def warm_up(base_url: str, token: str, max_tokens: int) -> str:
    """The served model's name, after one request (the first forward pays for lazy setup)."""
    async def go() -> str:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            model = await model_name(session, base_url, token)
            await chat(session, base_url, token, model, messages_of(SYSTEM, [], "Hello, who are you?"),
                       max_tokens)
            return model
    return asyncio.run(go())


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


def run_stacks(study: dict, args) -> None:
    """Start the services, warm up, run each level (a failed level is recorded, the others go on)."""
    all_users = list(bench_users(1 + sum(args.levels)))
    compute: dict[str, Any] = {"max_num_seqs": MAX_NUM_SEQS, "torch_threads": args.torch_threads}
    config = bench_config(pool_tokens=args.pool_tokens, max_context_tokens=1024, users=len(all_users),
                          max_new_tokens=args.max_tokens, compute=compute,
                          frontend={"max_concurrent_turns": max(64, *args.levels), "max_waiting_turns": 256,
                                    "queue_timeout_s": 600.0})
    total = args.requests_per_client * sum(args.levels) * len(args.replicas)
    with data_dir(args, NAME) as services, progress_for(args, total, NAME) as progress:
        if args.smoke:
            from bench.study.tiny_model import make_tiny_model
            config["compute"]["model_cache_dir"] = str(make_tiny_model(services / "tiny-model"))
        if args.replicas == [1]:  # the study as it always was
            study["results"]["levels"] = {}
            run_stack(study, args, config, services / "stack", all_users, 1, study["results"]["levels"],
                      progress)
            return
        by = study["results"]["by_replicas"] = {}
        for n in args.replicas:
            levels = by.setdefault(str(n), {"levels": {}})["levels"]
            if n == args.replicas[0]:  # the single-count claims and plots are the smallest count's
                study["results"]["levels"] = levels
            run_part(study, f"services ({n} replica{'s' if n > 1 else ''})",
                     lambda: run_stack(study, args, replicas_config(config, n, args.routing),
                                       services / f"stack-{n}r", all_users, n, levels, progress))


def replicas_config(config: dict, replicas: int, routing: str) -> dict:
    """The config of a stack of `replicas` replicas: the frontend routes by `routing` over several."""
    if replicas == 1:
        return config
    return {**config, "frontend": {**config["frontend"], "routing": routing}}


def run_stack(study: dict, args, config: dict, path: Path, all_users: list[str], replicas: int,
              levels: dict, progress: Progress) -> None:
    """One stack of `replicas` replicas, every level into `levels` (a failed level recorded, the rest run)."""
    with Stack(path, config, policy=args.policy, keep_data=args.keep_data, placement=args.placement,
               replicas=replicas) as stack:
        entry = study["results"].get("by_replicas", {}).get(str(replicas))
        if entry is not None:  # each count's CPUs: the page's machine line says only the last stack's
            entry["placement"] = {"cpus": stack.service_cpus(), "torch_threads": stack.compute_threads()}
        base_url = "http://" + stack.address("frontend", "http")
        model = warm_up(base_url, stack.token(all_users[0]), args.max_tokens)
        study["results"]["model"] = model
        given = iter(all_users[1:])
        for c in args.levels:
            users = [next(given) for _ in range(c)]  # new users per level: nothing one stored is another's
            part = f"level {c}" if args.replicas == [1] else f"level {c}, {replicas} replicas"
            figures = run_part(study, part,
                               lambda: run_level(stack, base_url, model, c, users, args, progress))
            if figures is None:
                error = next(f["error"] for f in reversed(study["failed"]) if f["part"] == part)
                levels[str(c)] = {"failed": error}
                progress.update(args.requests_per_client * c, note=f"{c} concurrent failed")
            else:
                levels[str(c)] = figures
        if args.profile_obj is not None:  # every service's pacer, the frontend's software stretch too
            args.pacing += scaled.stack_pacing(stack, frontend=True)


# -- plots and the page -----------------------------------------------------------------------------------

def draw(study: dict, out: Path) -> list[Path | None]:
    levels = measured_levels(study)
    xs = sorted(levels)
    if not xs:
        return []

    def series(key: str, stat: str | None = None) -> tuple[list[int], list[float]]:
        pts = [(c, _v(levels[c], key, stat) if stat else levels[c].get(key)) for c in xs]
        pts = [(c, v) for c, v in pts if v is not None]
        return [c for c, _ in pts], [v for _, v in pts]

    table1 = plot_lines(out / "scalellm-table1-ttft-tbt.png",
                        {"TTFT p50": series("ttft_ms", "p50"), "TTFT p99": series("ttft_ms", "p99"),
                         "TTFT p99, timed-out requests included": series("ttft_ms_incl_timeouts", "p99"),
                         "TBT p50": series("tbt_ms", "p50"), "TBT p99": series("tbt_ms", "p99")},
                        title="Table 1: TTFT and TBT against concurrency (streamed, OpenAI HTTP)",
                        xlabel="concurrent requests", ylabel="ms", logx=True, logy=True)
    fig6 = plot_lines(out / "scalellm-fig6-latency.png",
                      {"engine latency": series("engine_ms_mean"),
                       "gateway latency": series("gateway_ms_mean"),
                       "gateway, from the client (client e2e - engine)": series("client_gateway_ms_mean")},
                      title="Fig. 6: average latency by concurrency, engine and gateway",
                      xlabel="concurrent requests", ylabel="ms (mean per request)", logx=True, logy=True)
    fig7 = plot_lines(out / "scalellm-fig7-throughput.png",
                      {"generated tokens/s (compute node)": series("generated_tokens_per_s"),
                       "tokens/s of completed requests": series("output_tokens_per_s")},
                      title="Fig. 7: throughput against concurrency", xlabel="concurrent requests",
                      ylabel="output tokens/s", logx=True)
    return [table1, fig6, fig7]


def _ms(f: dict, key: str, stat: str) -> str:
    v = _v(f, key, stat)
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _tps(f: dict) -> str:
    generated = f.get("generated_tokens_per_s")
    return f"{f['output_tokens_per_s']:.1f}" + ("" if generated is None else f" ({generated:.1f})")


def level_table(study: dict) -> str:
    """Table 1's shape, one row per level, with Fig. 6's and Fig. 7's figures."""
    head = ["concurrent", "requests", "completed", "timeouts", "errors", "TTFT p50 ms", "TTFT p99 ms",
            "TTFT p99 incl. timeouts ms", "TBT p50 ms", "TBT p99 ms", "tokens/s (generated)", "engine ms",
            "gateway ms", "gateway share", "gateway from client ms"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c, f in sorted(study["results"].get("levels", {}).items(), key=lambda kv: int(kv[0])):
        if "failed" in f:
            error = " ".join(str(f["failed"]).replace("|", "/").split())
            rows.append(f"| {c} | failed: {error} |" + " |" * (len(head) - 2))
            continue
        share = f.get("gateway_share")
        cells = [c, f["requests"], f["completed"], f["timeouts"], f["errors"],
                 _ms(f, "ttft_ms", "p50"), _ms(f, "ttft_ms", "p99"), _ms(f, "ttft_ms_incl_timeouts", "p99"),
                 _ms(f, "tbt_ms", "p50"), _ms(f, "tbt_ms", "p99"),
                 _tps(f), _ms(f, "engine_ms_mean", ""),
                 _ms(f, "gateway_ms_mean", ""),
                 "-" if share is None else f"{share:.1%}", _ms(f, "client_gateway_ms_mean", "")]
        rows.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(rows)


def intro_of(study: dict) -> str:
    s = study["settings"]
    model = "a tiny random 2-layer Llama (--smoke: checks the study runs; its figures mean nothing)" \
        if s["smoke"] else "SmolLM2-135M"
    return (f"ScaleLLM's end-to-end serving figures (Table 1, Fig. 6, Fig. 7) on this testbed: {model} "
            f"in the "
            f"compute node on the CPU ({study['machine'].get('cores')} cores, shared with the frontend, the "
            f"SmartNIC agent, the storage node and the clients), under the `{s['policy']}` KV policy. "
            f"Levels {', '.join(map(str, s['levels']))} concurrent clients, each sending "
            f"{s['requests_per_client']} requests back to back ({s['requests_per_client']} x c per level; "
            f"ScaleLLM sends 20 x c), {s['requests_total']} in all, streamed through the frontend's OpenAI "
            f"HTTP API (`stream: true`, `stream_options.include_usage`), greedy, max_tokens "
            f"{s['max_tokens']} (ScaleLLM: 512); a request unfinished {s['timeout_s']:g} s after it was sent "
            f"is a timeout. The compute node batches up to {s['max_num_seqs']} sequences: at a higher level "
            f"the rest wait in its queue. {PAPER}: compare shapes and ratios, not absolute numbers."
            + replicas_text(s, study["machine"].get("cores")))


def replicas_body(study: dict) -> list[str]:
    """With several replica counts: Fig. 8's table, then each count's Table 1 (the page's first table is
    the smallest count's)."""
    by = study["results"].get("by_replicas") or {}
    if not by:
        return []
    lines = ["## Fig. 8: replica counts side by side", "",
             replica_table(study) or "no replica count ran", "", placements_text(study), "",
             "Each count is a stack of its own, run through the same levels with new users; tokens/s are the "
             "tokens every compute node generated over the level's wall time (else the completed requests'), "
             "TTFT p50 counts the timed-out requests as Table 1's claims do, and each ratio is the larger "
             "count over the smaller at the same level; `served by` counts the completed requests by the "
             "replica their turn summary names (how the frontend's routing spread them).", ""]
    for n, entry in sorted(by.items(), key=lambda kv: int(kv[0]))[1:]:
        lines += [f"## Table 1, Fig. 6 and Fig. 7 by level, {n} replicas", "",
                  level_table({"results": {"levels": entry["levels"]}}), ""]
    return lines


def body_of(study: dict) -> str:
    counts = study["settings"].get("replicas") or [1]
    return "\n".join([
        *replicas_body(study),
        "## Table 1, Fig. 6 and Fig. 7 by level" + ("" if counts == [1] else
                                                    f", {counts[0]} replica{'s' if counts[0] > 1 else ''}"),
        "",
        level_table(study), "",
        "TTFT, TBT and e2e are the client's clocks over the completed requests (timeouts and errors counted "
        "beside them); `TTFT p99 incl. timeouts` counts the timed-out requests too, at their first text or, "
        "if none came, at the timeout (a lower bound), and the claims use that TTFT; TBT is (e2e - TTFT) / "
        "(completion tokens - 1) per request; tokens/s are the completed "
        "requests' completion tokens over the level's wall time (first request sent to last one ended), and "
        "in brackets every token the compute node generated in that time, timed-out requests' included "
        "(ScaleLLM's throughput; Fig. 7 and the claims use it when the node's counters answered).", "",
        "Engine and gateway: the HTTP response carries only the usage chunk and the context id "
        "(X-Session-Id), not the engine's time, so after each level the study reads each completed request's "
        "stored turn summary from the frontend (gRPC GetContext as its user). `engine ms` is the compute "
        "node's time for the turn, from its arrival there (its scheduler's queue included) to its last "
        "token; `gateway ms` is the frontend's e2e minus that (admission, authentication, the SmartNIC "
        "agent, streaming back), the split of this repo's turn summary; `gateway from client` is the "
        "client's e2e minus engine time, ScaleLLM's gateway latency as the user sees it, including the HTTP "
        "client in this process on the same cores.", ""])


def settings_of(args) -> dict:
    return {"levels": args.levels, "requests_per_client": args.requests_per_client,
            "requests_per_level": {str(c): args.requests_per_client * c for c in args.levels},
            "requests_total": args.requests_per_client * sum(args.levels) * len(args.replicas),
            "max_tokens": args.max_tokens, "timeout_s": args.timeout_s, "temperature": 0.0,
            "stream": True, "include_usage": True, "api": "OpenAI HTTP /v1/chat/completions",
            "prompt": {"system": SYSTEM, "questions": len(STEMS) * len(TOPICS),
                       "example": prompt_of(0)[-1]["content"],
                       "shape": "a system prompt and one chat-style question; each client's questions "
                                "distinct"},
            "policy": args.policy, "pool_tokens": args.pool_tokens, "max_num_seqs": MAX_NUM_SEQS,
            "torch_threads": args.torch_threads, "replicas": args.replicas,
            "routing": args.routing if max(args.replicas) > 1 else None,
            "model": "tiny random Llama (smoke)" if args.smoke else "SmolLM2-135M", "smoke": args.smoke}


def run(args: argparse.Namespace) -> tuple[dict, str, str, str]:
    study = new_study(NAME, args, settings_of(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_part(study, "services", lambda: run_levels(study, args))
    add_ratios(study)
    add_claims(study)
    add_replica_ratios(study)
    add_replica_claims(study)
    study["plots"] += [p for p in run_part(study, "plots", lambda: draw(study, out)) or [] if p]
    study["plots"] += [p for p in run_part(study, "plots", lambda: draw_replicas(study, out)) or [] if p]
    title = "ScaleLLM: latency and throughput against concurrency, through the OpenAI HTTP API"
    intro = intro_of(study)
    if args.profile_obj is not None:
        title += f", under the hardware profile `{args.profile_obj.name}` (virtual time)"
        intro = scaled_note(args.profile_obj) + "\n\n" + intro
    return study, title, intro, body_of(study)


def scaled_note(profile) -> str:
    """What a run under a hardware profile charges, and what it does not."""
    return (f"## Under the hardware profile `{profile.name}`\n\n{profile.description}\n\n"
            "Every engine step takes the roofline time of the virtual model's step on the profile's GPU (the real "
            "model still computes every token), every KV transfer the profile's links and drive. The frontend and "
            "the agent's control plane are software on both worlds: their CPU time is stretched by D, so that in "
            "virtual time they run at their real speed (`frontend_software`, `agent_software` in the pacing). "
            "TTFT, TBT, e2e, engine and gateway times, throughput and the timeout are virtual (wall / D). The "
            "HTTP clients run in this process unstretched: their own time is D times shorter in virtual time "
            "than it is here, so the client's share of `gateway from client` is understated.")


main = main_of(parse_args, run)
