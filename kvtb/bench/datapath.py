"""`kvtb bench datapath`: KV PUT and GET throughput through the whole path, beside this machine's limits.

The path: a registered region, the agent's triggered engine and data path (gather from 128
strided ranges per chunk, as in a KV pool), ZeroMQ, a real storage node process (fabric front
end, queue manager, extent allocator, file, fsync), and back into the region, checked byte
for byte. It reuses `kvtb bench smartnic`'s transfer functions with chunk sizes from 64 KiB to
64 MiB; the raw limits (ZeroMQ tcp, pwrite+fsync, page-cache pread) are measured in the same
run on the same disk, each moving as many distinct bytes as a transfer (`--total-mib`), taking
turns with the transfer's rounds (see `kvtb bench smartnic`). PUT limit = min(zmq,
pwrite+fsync); GET limit = min(zmq, pread).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
from pathlib import Path

from kvtb.bench.chunk_layout import RANGES_PER_CHUNK
from kvtb.bench.common import add_common_args, new_result, progress_for
from kvtb.bench.emit import add_run_args, ratios_text, run_bench, services_dir
from kvtb.bench.output import format_bytes, format_table, plot_lines
from kvtb.heap import keep_large_buffers_in_the_heap
from kvtb.launch import ServiceProcess, kvtb_argv
from smartnic import bench as nic_bench
from smartnic.agent import Agent
from smartnic.settings import SmartNicSettings, StorageNodeRef

logger = logging.getLogger(__name__)

KIB = 1024
SIZES = (64 * KIB, 256 * KIB, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
SMOKE_SIZES = (64 * KIB, 1 << 20)
FLOOR_BYTES = 16 << 20
FLOOR = 0.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench datapath", description=__doc__.splitlines()[0])
    add_common_args(parser, "datapath")
    add_run_args(parser)
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


def start_storage(data_dir: Path) -> ServiceProcess:
    """A real storage node process on free ports."""
    proc = ServiceProcess("storage-datapath", kvtb_argv("serve", "storage"), data_dir / "storage.log", env={
        "KVTB_STORAGE_DATA_DIR": str(data_dir / "storage"), "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0",
        "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0", "KVTB_STORAGE_METRICS_ADDRESS": "127.0.0.1:0",
        "KVTB_STORAGE_NODE_NAME": "datapath"})
    proc.start(timeout_s=60)
    return proc


def measure(args: argparse.Namespace, data_dir: Path, progress) -> list[dict]:
    """Per chunk size: the whole path, the storage node alone, and the raw limits."""
    storage = start_storage(data_dir)
    node = StorageNodeRef("datapath", storage.addresses["admin"], storage.addresses["fabric"])
    most_chunks = max(max(2, (args.total_mib << 20) // size) for size in args.sizes)
    agent = Agent(SmartNicSettings(listen_address="127.0.0.1:0", storage_nodes=(node,),
                                   eviction_policy="timer", queue_bound=max(512, most_chunks)))
    rows = []
    try:
        agent.start()
        for size in args.sizes:
            rows.append(nic_bench.transfer_beside_limits(agent, node.fabric_address, size,
                                                         args.total_mib << 20, args.rounds, args.budget_s,
                                                         data_dir))
            progress.update(note=format_bytes(size))
    finally:
        agent.close()
        storage.stop()
    return rows


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
    rows = []
    for t in result["results"]["chunks"]:
        alone, bare = t["storage_node_direct"], t["bare_path_bytes_per_s"]
        rows.append([format_bytes(t["chunk_bytes"]),
                     *(f"{v / 1e6:.0f}" for v in (t["put_bytes_per_s"], alone["put_bytes_per_s"], bare["put"],
                                                  t["put_limit_bytes_per_s"])), f"{t['put_vs_limit']:.2f}",
                     *(f"{v / 1e6:.0f}" for v in (t["get_bytes_per_s"], alone["get_bytes_per_s"], bare["get"],
                                                  t["get_limit_bytes_per_s"])), f"{t['get_vs_limit']:.2f}"])
    head = ["chunk", "PUT MB/s", "node alone", "bare path", "raw limit", "PUT/limit",
            "GET MB/s", "node alone", "bare path", "raw limit", "GET/limit"]
    rounds = "\n".join(nic_bench.rounds_line(t) for t in result["results"]["chunks"])
    return (f"{format_table(head, rows)}\n{rounds}\n\n{nic_bench.cpu_table(result['results']['chunks'])}\n\n"
            f"{ratios_text(result['ratios'])}")


def plot(result: dict, out: Path) -> str:
    chunks = result["results"]["chunks"]
    xs = [t["chunk_bytes"] / KIB for t in chunks]
    series = {f"{op.upper()} {label}": (xs, [get(t) / 1e6 for t in chunks])
              for op in ("put", "get")
              for label, get in (("whole path", lambda t, o=op: t[f"{o}_bytes_per_s"]),
                                 ("raw limit", lambda t, o=op: t[f"{o}_limit_bytes_per_s"]))}
    return str(plot_lines(out / "datapath.png", series, title="KV PUT/GET through region, agent, storage",
                          xlabel="chunk size (KiB)", ylabel="MB/s", logx=True, logy=True))


def run(args: argparse.Namespace) -> dict:
    keep_large_buffers_in_the_heap()  # the agent runs in this process: as its main sets it up, first
    result = new_result("datapath", {"sizes_bytes": args.sizes, "total_mib": args.total_mib,
                                     "rounds": args.rounds, "budget_s": args.budget_s, "fsync": True,
                                     "ranges_per_chunk": RANGES_PER_CHUNK, "smoke": args.smoke,
                                     "load_average_1m_at_start": os.getloadavg()[0]})
    data_dir = services_dir(args, "datapath")
    try:
        with progress_for(args, len(args.sizes), "datapath") as progress:
            rows = measure(args, data_dir, progress)
    except BaseException:
        if not args.keep_data:
            logger.warning("the storage node's files are kept in %s", data_dir)
        raise
    if not args.keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)
    result["results"]["chunks"] = rows
    result["transfers"] = calibration_transfers(rows)
    for t in rows:
        size = format_bytes(t["chunk_bytes"]).replace(" ", "").replace("i", "").lower()
        for op in ("put", "get"):
            result["ratios"][f"{op}_vs_limit_{size}"] = t[f"{op}_vs_limit"]
            result["ratios"][f"bare_{op}_vs_limit_{size}"] = t[f"bare_{op}_vs_limit"]
            if t[f"{op}_cpu_ceiling_vs_limit"] is not None:
                result["ratios"][f"{op}_cpu_ceiling_vs_limit_{size}"] = t[f"{op}_cpu_ceiling_vs_limit"]
    at_floor = [t for t in rows if t["chunk_bytes"] == FLOOR_BYTES]
    if at_floor:
        for op in ("put", "get"):
            result["ratios"][f"{op}_vs_limit"] = at_floor[0][f"{op}_vs_limit"]
        result["floors"] = {f"{op}_vs_limit": {"floor": FLOOR, "value": at_floor[0][f"{op}_vs_limit"],
                                               "met": at_floor[0][f"{op}_vs_limit"] >= FLOOR}
                            for op in ("put", "get")}
    result["plots"] = [plot(result, Path(args.out))]
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
