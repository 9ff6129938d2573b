"""`kvtb bench datapath`: KV PUT and GET throughput through the whole path, beside this machine's limits.

The path: a registered region, the agent's triggered engine and data path (gather from 128
strided ranges per chunk, as from the slot-major pool it was written for; a paged pool's block is
one extent), ZeroMQ, a real storage node process (fabric front
end, queue manager, extent allocator, file, fsync), and back into the region, checked byte
for byte. It reuses `kvtb bench smartnic`'s transfer functions with chunk sizes from 64 KiB to
64 MiB; the raw limits (ZeroMQ tcp, pwrite+fsync, page-cache pread) are measured in the same
run on the same disk, each moving as many distinct bytes as a transfer (`--total-mib`), taking
turns with the transfer's rounds (see `bench.smartnic`). PUT limit = min(zmq, pwrite+fsync);
GET limit = min(zmq, pread). Every size runs in each security mode side by side, in turns
(`bench.smartnic.SECURITY`): the default (fabric authentication and the KV MAC), none, and CURVE
encryption on top; `put_secure_vs_open` and `get_secure_vs_open` at 16 MiB say what the default
costs (floor 0.75, goal 0.9). Chunks are stored as the product stores a block, a MAC per layer
of the real model (30 KV parts; `bench.smartnic.LayerParts`); the chunk format's version and
kv_parts are in the settings. A size that fails is reported failed with its error.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bench import smartnic
from bench.results import (
    add_common_args,
    data_dir,
    failed_text,
    floors,
    format_bytes,
    new_result,
    plot_lines,
    plots,
    progress_for,
    ratios_text,
    run_bench,
)
from kvtb.heap import keep_large_buffers_in_the_heap

logger = logging.getLogger(__name__)

KIB = 1024
SIZES = (64 * KIB, 256 * KIB, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
SMOKE_SIZES = (64 * KIB, 1 << 20)
FLOOR_BYTES = 16 << 20
FLOOR = smartnic.FLOOR


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench datapath", description=__doc__.splitlines()[0])
    add_common_args(parser, "datapath")
    parser.add_argument("--sizes-kib", type=lambda s: [int(x) * KIB for x in s.split(",")],
                        help="chunk sizes in KiB, comma-separated (default 64 KiB to 64 MiB)")
    parser.add_argument("--total-mib", type=int, default=128, help="bytes moved per size and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (the best is kept)")
    parser.add_argument("--budget-s", type=float, default=1.0,
                        help="seconds per raw-limit measurement (cut into --rounds windows, the best kept)")
    args = parser.parse_args(argv)
    args.sizes = args.sizes_kib or list(SMOKE_SIZES if args.smoke else SIZES)
    if args.smoke:
        args.total_mib, args.rounds, args.budget_s = min(args.total_mib, 4), 1, min(args.budget_s, 0.2)
    return args


def measure(args: argparse.Namespace, directory: Path, progress, result: dict) -> list[dict]:
    """Per chunk size: the whole path beside the storage node alone and the raw limits (a size
    that fails is recorded in result["failed"])."""
    most_chunks = max(max(2, (args.total_mib << 20) // size) for size in args.sizes)
    with smartnic.agents_beside_storage(directory, max(512, most_chunks)) as agents:
        return smartnic.transfers_by_size(result, agents, args.sizes, args.total_mib << 20, args.rounds,
                                          args.budget_s, directory, progress)


def calibration_transfers(rows: list[dict]) -> list[dict]:
    """Per-chunk times for `kvtb simulate --calibrate`: triggered = the agent's path, cpu = a host client.

    Chunks are pipelined, so `seconds` is the amortized time per chunk (chunk bytes / throughput).
    """
    out = []
    for t in rows:
        for mode, figures in (("triggered", t), ("cpu", t["storage_node_direct"])):
            for op in ("put", "get"):
                out.append({"mode": mode, "direction": op, "bytes": t["chunk_bytes"],
                            "seconds": t["chunk_bytes"] / figures[f"{op}_bytes_per_s"]})
    return out


def table(result: dict) -> str:
    failed = failed_text(result)
    return (f"{smartnic.chunks_line(result)}\n{smartnic.transfers_table(result['results']['chunks'])}\n\n"
            f"{ratios_text(result['ratios'])}" + (f"\n\n{failed}" if failed else ""))


def plot(result: dict, out: Path) -> Path | None:
    chunks = result["results"]["chunks"]
    xs = [t["chunk_bytes"] / KIB for t in chunks]
    series = {f"{op.upper()} {label}": (xs, [get(t) / 1e6 for t in chunks])
              for op in ("put", "get")
              for label, get in (("whole path", lambda t, o=op: t[f"{o}_bytes_per_s"]),
                                 ("raw limit", lambda t, o=op: t[f"{o}_limit_bytes_per_s"]))}
    return plot_lines(out / "datapath.png", series, title="KV PUT/GET through region, agent, storage",
                      xlabel="chunk size (KiB)", ylabel="MB/s", logx=True, logy=True)


def run(args: argparse.Namespace) -> dict:
    keep_large_buffers_in_the_heap()  # the agent runs in this process: as its main sets it up, first
    result = new_result("datapath", {"sizes_bytes": args.sizes, "total_mib": args.total_mib,
                                     "rounds": args.rounds, "budget_s": args.budget_s, "fsync": True,
                                     **smartnic.chunk_format_settings(), "smoke": args.smoke})
    with progress_for(args, len(args.sizes), "datapath") as progress, data_dir(args, "datapath") as path:
        rows = measure(args, path, progress, result)
    result["results"]["chunks"] = rows
    result["transfers"] = calibration_transfers(rows)
    for t in rows:
        size = format_bytes(t["chunk_bytes"]).replace(" ", "").replace("i", "").lower()
        for op in ("put", "get"):
            result["ratios"][f"{op}_vs_limit_{size}"] = t[f"{op}_vs_limit"]
        if t["chunk_bytes"] == FLOOR_BYTES:
            result["ratios"] |= {f"{op}_vs_limit": t[f"{op}_vs_limit"] for op in ("put", "get")}
    result["ratios"] |= smartnic.security_ratios(rows)
    result["floors"] = floors(result["ratios"], {"put_vs_limit": FLOOR, "get_vs_limit": FLOOR,
                                                 **smartnic.SECURITY_FLOORS})
    result["plots"] = plots(plot(result, Path(args.out)))
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
