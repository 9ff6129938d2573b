"""`kvtb bench offload` over chunk sizes: decode TBT and the compute process's stall per chunk.

Runs the compute node's own `kvtb bench offload --chunk-tokens N --json` (compute_node/bench.py)
once per chunk size (8, 32, 128 tokens), each a fresh set of services, and puts the figures
side by side: mean TBT under resident, triggered and cpu, and the stall per offloaded chunk
under triggered and cpu. Called by `kvtb bench all`; `python -m kvtb.bench.offload_sweep`.
"""
from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

from kvtb.bench.common import add_common_args, new_result, progress_for
from kvtb.bench.emit import add_run_args, ratios_text, run_bench
from kvtb.bench.output import format_table, plot_lines
from kvtb.bench.stats import ratio
from kvtb.launch import kvtb_argv

logger = logging.getLogger(__name__)

CHUNK_TOKENS = (8, 32, 128)
POLICIES = ("resident", "triggered", "cpu")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench offload-sweep", description=__doc__.splitlines()[0])
    add_common_args(parser, "offload")
    add_run_args(parser)
    parser.add_argument("--chunk-tokens", type=int, nargs="+", help=f"chunk sizes (default {CHUNK_TOKENS})")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    args.chunk_tokens = args.chunk_tokens or ([8] if args.smoke else list(CHUNK_TOKENS))
    if args.smoke:
        args.decode_tokens, args.repeats = min(args.decode_tokens, 12), 1
    return args


def run_one(args: argparse.Namespace, chunk: int) -> dict:
    """One `kvtb bench offload` run; its JSON object (raises with its stderr when it fails)."""
    out = Path(args.out) / f"chunk-{chunk}"
    argv = kvtb_argv("bench", "offload", "--json", "--out", str(out), "--chunk-tokens", str(chunk),
                     "--decode-tokens", str(args.decode_tokens), "--repeats", str(args.repeats))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"kvtb bench offload --chunk-tokens {chunk} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(result: dict) -> str:
    rows = []
    for chunk, r in result["results"]["chunks"].items():
        d = r["results"]["decode"]
        rows.append([chunk, *(f"{d[p]['tbt_ms']:.2f}" for p in POLICIES),
                     *(f"{d[p]['stall_per_chunk_ms']:.3f}" for p in ("triggered", "cpu"))])
    head = ["chunk tokens", "TBT resident", "TBT triggered", "TBT cpu",
            "stall/chunk triggered", "stall/chunk cpu"]
    return (f"decode of {result['settings']['decode_tokens']} tokens, times in ms\n"
            f"{format_table(head, rows)}\n\n{ratios_text(result['ratios'])}")


def plot(result: dict, out: Path) -> str:
    chunks = result["results"]["chunks"]
    xs = [int(c) for c in chunks]
    series = {f"stall/chunk {p}": (xs, [chunks[str(c)]["results"]["decode"][p]["stall_per_chunk_ms"]
                                        for c in xs])
              for p in ("triggered", "cpu")}
    return str(plot_lines(out / "offload.png", series, title="Compute-process stall per offloaded chunk",
                          xlabel="chunk tokens", ylabel="ms per chunk", logx=True, logy=True))


def run(args: argparse.Namespace) -> dict:
    result = new_result("offload", {"chunk_tokens": args.chunk_tokens, "decode_tokens": args.decode_tokens,
                                    "repeats": args.repeats, "smoke": args.smoke})
    result["results"]["chunks"] = {}
    with progress_for(args, len(args.chunk_tokens), "offload") as progress:
        for chunk in args.chunk_tokens:
            r = run_one(args, chunk)
            result["results"]["chunks"][str(chunk)] = r
            d = r["results"]["decode"]
            result["ratios"][f"cpu_stall_vs_triggered_{chunk}"] = ratio(d["cpu"]["stall_per_chunk_ms"],
                                                                        d["triggered"]["stall_per_chunk_ms"])
            result["ratios"][f"triggered_tbt_vs_resident_{chunk}"] = ratio(d["triggered"]["tbt_ms"],
                                                                           d["resident"]["tbt_ms"])
            result["ratios"][f"cpu_tbt_vs_resident_{chunk}"] = ratio(d["cpu"]["tbt_ms"],
                                                                     d["resident"]["tbt_ms"])
            progress.update(note=f"{chunk} tokens")
    result["plots"] = [plot(result, Path(args.out))]
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
