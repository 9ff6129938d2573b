"""`kvtb bench aiperf`: NVIDIA AIPerf against the stock stack, one key, then `kvtb bench concurrency` beside it.

Every service runs as a process (`kvtb up`'s wiring, bench.stack) with the frontend's stock admission
settings, in placement `nic` by default: the compute node on a core of its own, AIPerf beside the
frontend on the others (AIPerf's timing manager spins a whole core: sharing the model's cores it made
a request at concurrency 1 seven times slower here). AIPerf (its own virtual environment:
docs/aiperf.md; --aiperf names its command) drives the
OpenAI API with one user's token at each level of --levels (default 1 and 32): --requests requests
(default 64; at concurrency 1, --requests-at-1, default 8), --isl prompt tokens and exactly --osl
output tokens each (`ignore_eos`, `min_tokens`), greedy, streamed. Per level: requests completed and
refused (AIPerf does not retry a 429), output tokens/s, TTFT. Then the same requests (AIPerf's own
payloads, from its inputs.json) at the same concurrency through the testbed's light client
(bench.openai_client), on the same stack: what AIPerf as a client changes, apart from the workload. Then `kvtb bench concurrency --levels 1
32 --placements PLACEMENT` runs on a stack of its own, right after, in the same command, and the
ratios compare the two:
AIPerf's tokens/s at the top level ÷ at 1 against the concurrency bench's. Targets (issue 40): no
request refused, and AIPerf's ratio at least 0.8 of the concurrency bench's.

The tokenizer: AIPerf counts tokens with a Hugging Face tokenizer and loads it offline only from the
Hugging Face cache layout; the command puts the compute node's cached SmolLM2 tokenizer files there, in
a cache of its own under the run's data directory (docs/aiperf.md says why).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from bench import concurrency
from bench.openai_client import send
from bench.placements import PLACEMENTS
from bench.results import add_common_args, data_dir, fail, floors, format_table, new_result, ratios_text, run_bench
from bench.stack import Stack, bench_config
from bench.stats import percentile, ratio
from chat_frontend.settings import FrontendSettings
from compute_node.settings import ComputeSettings
from kvtb.placement import format_cpus, parse_cpus

logger = logging.getLogger(__name__)

MODEL = "SmolLM2-135M-Instruct"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
USER = "u0"
FLOORS = {"aiperf_vs_concurrency_bench": 0.8, "completed_share_top": 1.0}
CEILINGS = {"refused_top": 0.0}
TIMEOUT_S = 1800.0  # one AIPerf level at most


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench aiperf", description=__doc__.splitlines()[0])
    add_common_args(parser, "aiperf")
    parser.add_argument("--aiperf", default=os.environ.get("KVTB_AIPERF") or shutil.which("aiperf") or "aiperf",
                        help="AIPerf's command (default $KVTB_AIPERF, else `aiperf` on PATH)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 32], help="concurrency levels (default 1 32)")
    parser.add_argument("--requests", type=int, default=64, help="requests per level above 1 (default 64)")
    parser.add_argument("--requests-at-1", type=int, default=8, help="requests at concurrency 1 (default 8)")
    parser.add_argument("--isl", type=int, default=128, help="prompt tokens per request (default 128)")
    parser.add_argument("--osl", type=int, default=32, help="output tokens per request (default 32)")
    parser.add_argument("--placement", choices=PLACEMENTS, default="nic",
                        help="the services' CPU placement (default nic: the compute node's cores are its own; "
                             "AIPerf runs on the frontend's)")
    parser.add_argument("--no-concurrency-bench", action="store_true",
                        help="skip `kvtb bench concurrency` after AIPerf (no ratio against it)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.levels, args.requests, args.requests_at_1, args.isl, args.osl = [1, 2], 4, 2, 16, 4
    if 1 not in args.levels or min(args.levels) < 1:
        parser.error("--levels must include 1 (the ratios are against it) and be positive")
    return args


def hf_cache(root: Path, model_cache_dir: str) -> Path:
    """A Hugging Face cache under root holding the compute node's tokenizer files as HUB_ID's snapshot
    (AIPerf resolves a tokenizer offline only so); its HF_HOME."""
    model = root / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = model / "snapshots" / "kvtestbed"
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        source = Path(model_cache_dir) / name
        if source.exists():
            shutil.copy(source, snapshot / name)
    (model / "refs").mkdir(exist_ok=True)
    (model / "refs" / "main").write_text("kvtestbed")
    return root


def aiperf_argv(args: argparse.Namespace, url: str, token: str, level: int, out: Path) -> list[str]:
    """AIPerf's command line for one level: streamed chat, fixed prompt and output lengths, greedy."""
    requests = args.requests_at_1 if level == 1 else args.requests
    extra = {"ignore_eos": True, "min_tokens": args.osl, "temperature": 0}
    return [args.aiperf, "profile", "-m", MODEL, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--api-key", token, "--tokenizer", HUB_ID, "--concurrency", str(level),
            "--request-count", str(requests), "--prompt-input-tokens-mean", str(args.isl),
            "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(args.osl),
            "--prompt-output-tokens-stddev", "0", "--extra-inputs", json.dumps(extra), "--random-seed", "1",
            "--output-artifact-dir", str(out), "--ui-type", "none", "--no-gpu-telemetry", "--no-server-metrics"]


def level_figures(export: dict) -> dict:
    """A level's figures from AIPerf's JSON export (profile_export_aiperf.json)."""
    def avg(tag: str) -> float | None:
        metric = export.get(tag)
        return metric.get("avg") if isinstance(metric, dict) else None

    def p50(tag: str) -> float | None:
        metric = export.get(tag)
        return metric.get("p50") if isinstance(metric, dict) else None
    errors = export.get("error_summary") or []
    refused = sum(e.get("count", 0) for e in errors if (e.get("error_details") or {}).get("code") == 429)
    # AIPerf 0.13: request_count counts the requests that succeeded, completed_request_count every one
    # that ended (errors too)
    return {"completed": avg("request_count") or 0, "ended": avg("completed_request_count"),
            "errors": sum(e.get("count", 0) for e in errors),
            "refused": refused, "output_tokens_per_s": avg("output_token_throughput"),
            "ttft_ms_p50": p50("time_to_first_token"), "request_latency_ms_p50": p50("request_latency"),
            "error_summary": errors}


def client_cpus(stack: Stack) -> set[int]:
    """Where AIPerf runs: the frontend's CPUs (under `nic`, not the compute node's); empty: anywhere."""
    return set(parse_cpus(stack.service_cpus().get("frontend", "")))


def run_level(args: argparse.Namespace, stack: Stack, level: int, work: Path, env: dict) -> dict:
    """AIPerf at one concurrency against the stack: its figures (RuntimeError with AIPerf's output tail)."""
    out = work / f"c{level}"
    argv = aiperf_argv(args, f"http://{stack.address('frontend', 'http')}", stack.token(USER), level, out)
    cpus = client_cpus(stack)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not exports:
        raise RuntimeError(f"aiperf exited {done.returncode}: {(done.stderr or done.stdout)[-2000:]}")
    figures = level_figures(json.loads(exports[-1].read_text()))
    figures["requests"] = args.requests_at_1 if level == 1 else args.requests
    return figures


def payloads_of(out: Path) -> list[dict]:
    """The request bodies AIPerf sent at a level (its inputs.json), each as it was sent."""
    inputs = sorted(out.rglob("inputs.json"))
    if not inputs:
        raise RuntimeError(f"no inputs.json under {out}")
    data = json.loads(inputs[-1].read_text()).get("data") or []
    return [payload for session in data for payload in session.get("payloads") or []]


def fresh(body: dict) -> dict:
    """The body with its first message marked, so that none of its KV is found stored from AIPerf's run
    of it (the chat template's head, every request's, is found for both alike)."""
    messages = [dict(m) for m in body.get("messages") or []]
    if messages and isinstance(messages[0].get("content"), str):
        messages[0]["content"] = "(again) " + messages[0]["content"]
    return {**body, "messages": messages}


async def replay(base_url: str, token: str, payloads: list[dict], concurrency: int) -> dict:
    """The payloads (fresh) through the light client, `concurrency` in flight: figures as level_figures'."""
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
        async def one(body: dict):
            async with gate:
                return await send(session, base_url, token, body)
        began = time.perf_counter()
        replies = await asyncio.gather(*(one(fresh(body)) for body in payloads), return_exceptions=True)
        wall_s = time.perf_counter() - began
    done = [r for r in replies if not isinstance(r, BaseException)]
    errors = [r for r in replies if isinstance(r, BaseException)]
    ttfts = sorted(r.ttft_s * 1e3 for r in done)
    return {"requests": len(payloads), "completed": len(done), "errors": len(errors),
            "refused": sum("HTTP 429" in str(e) for e in errors),
            "output_tokens_per_s": sum(r.completion_tokens for r in done) / wall_s if done else None,
            "ttft_ms_p50": percentile(ttfts, 50) if ttfts else None,
            "first_error": str(errors[0]) if errors else ""}


def measure(args: argparse.Namespace, result: dict) -> None:
    """Every AIPerf level on one stock stack, then the concurrency bench (its own stack)."""
    stock = FrontendSettings()
    config = bench_config(users=2, max_context_tokens=ComputeSettings().max_context_tokens,
                          frontend={"queue_timeout_s": stock.queue_timeout_s})
    with data_dir(args, "aiperf") as root:
        env = {**os.environ, "HF_HOME": str(hf_cache(root / "hf", ComputeSettings().model_cache_dir)),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        levels = result["results"]["levels"] = {}
        own = result["results"]["own_client"] = {}
        with Stack(root / "services", config, placement=args.placement) as stack:
            result["settings"]["aiperf_cpus"] = format_cpus(client_cpus(stack))
            base_url = f"http://{stack.address('frontend', 'http')}"
            for level in sorted(set(args.levels)):
                try:
                    levels[str(level)] = run_level(args, stack, level, root / "aiperf", env)
                    payloads = payloads_of(root / "aiperf" / f"c{level}")
                    own[str(level)] = asyncio.run(replay(base_url, stack.token(USER), payloads, level))
                except Exception as exc:  # noqa: BLE001 - a failed level is reported with its error
                    levels.setdefault(str(level), {"failed": fail(result, f"aiperf c={level}", exc)["error"]})
    if args.no_concurrency_bench:
        return
    top = max(args.levels)
    bench_argv = ["--levels", "1", str(top), "--placements", args.placement,
                  "--out", str(Path(args.out) / "concurrency")]
    if args.smoke:
        bench_argv.append("--smoke")
    bench_args = concurrency.parse_args(bench_argv)
    bench_result, _ = concurrency.run(bench_args)
    concurrency.add_ratios(bench_result)
    result["results"]["concurrency_bench"] = {
        "argv": bench_argv, "ratios": bench_result["ratios"], "failed": bench_result["failed"],
        "output_tokens_per_s": {level: f.get("output_tokens_per_s")
                                for level, f in bench_result["results"].get("levels", {}).items()}}
    result["failed"].extend(f"concurrency bench: {f}" for f in bench_result["failed"])


def add_ratios(result: dict, levels: list[int]) -> None:
    """AIPerf's tokens/s at the top level ÷ at 1, against the concurrency bench's, from one run."""
    figures = result["results"].get("levels", {})
    top = str(max(levels))
    one, high = figures.get("1", {}), figures.get(top, {})
    if "completed" in high:
        result["ratios"]["refused_top"] = high["refused"]
        result["ratios"]["completed_share_top"] = ratio(high["completed"], high["requests"])
    if one.get("output_tokens_per_s") and high.get("output_tokens_per_s"):
        result["ratios"][f"aiperf_tokens_per_s_{top}_vs_1"] = ratio(high["output_tokens_per_s"],
                                                                    one["output_tokens_per_s"])
        own = result["results"].get("own_client", {})
        if (own.get("1") or {}).get("output_tokens_per_s") and (own.get(top) or {}).get("output_tokens_per_s"):
            result["ratios"][f"own_client_tokens_per_s_{top}_vs_1"] = ratio(own[top]["output_tokens_per_s"],
                                                                            own["1"]["output_tokens_per_s"])
            result["ratios"]["aiperf_vs_own_client"] = ratio(result["ratios"][f"aiperf_tokens_per_s_{top}_vs_1"],
                                                             result["ratios"][f"own_client_tokens_per_s_{top}_vs_1"])
        bench = (result["results"].get("concurrency_bench") or {}).get("ratios", {})
        theirs = bench.get(f"tokens_per_s_{top}_vs_1")
        if theirs:
            result["ratios"][f"concurrency_bench_tokens_per_s_{top}_vs_1"] = theirs
            result["ratios"]["aiperf_vs_concurrency_bench"] = ratio(
                result["ratios"][f"aiperf_tokens_per_s_{top}_vs_1"], theirs)
    result["floors"] = floors(result["ratios"], FLOORS, CEILINGS)


def run(args: argparse.Namespace) -> dict:
    settings = {"levels": args.levels, "requests": args.requests, "requests_at_1": args.requests_at_1,
                "isl": args.isl, "osl": args.osl, "aiperf": args.aiperf, "smoke": args.smoke,
                "placement": args.placement,
                "frontend": "stock admission settings (chat_frontend.settings)"}
    result = new_result("aiperf", settings)
    result["results"]["levels"] = {}
    if not shutil.which(args.aiperf):
        fail(result, "aiperf", FileNotFoundError(f"no AIPerf command {args.aiperf!r}: install it in its own "
                                                 "virtual environment (docs/aiperf.md) and pass --aiperf"))
        return result
    try:
        measure(args, result)
    except Exception as exc:  # noqa: BLE001 - a failed run is reported with its error
        fail(result, "aiperf", exc)
    add_ratios(result, args.levels)
    return result


def table(result: dict) -> str:
    head = ["concurrency", "requests", "completed", "refused (429)", "errors", "output tokens/s", "TTFT p50 ms"]
    head = ["client", *head]
    rows = []
    for client, key in (("AIPerf", "levels"), ("own client, AIPerf's requests", "own_client")):
        for level, f in sorted(result["results"].get(key, {}).items(), key=lambda kv: int(kv[0])):
            if "failed" in f:
                rows.append([client, level, "-", "failed", "-", "-", "-", "-"])
                continue
            rows.append([client, level, f["requests"], f"{f['completed']:.0f}", f["refused"], f["errors"],
                         f"{f['output_tokens_per_s']:.1f}" if f["output_tokens_per_s"] else "-",
                         f"{f['ttft_ms_p50']:.0f}" if f["ttft_ms_p50"] else "-"])
    s = result["settings"]
    return (f"AIPerf, one key, the stock admission settings, placement {s['placement']} (AIPerf on CPUs "
            f"{s.get('aiperf_cpus') or 'any'})\n{format_table(head, rows)}\n\n{ratios_text(result['ratios'])}")


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
