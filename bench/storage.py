"""`kvtb bench storage`: Store/Retrieve through a storage node beside this machine's file and ZeroMQ limits.

The node (a separate process, fsync on) is driven by one FabricClient with `--concurrency`
commands in flight. Before each of `--rounds` rounds every raw limit (`bench.rawlimits`, on the
node's disk, as many distinct bytes as a round moves) measures one window: ZeroMQ tcp between two
processes, and pwrite+fsync and cached pread both on one thread and on `--concurrency` threads,
the better of the two counting, so that no weak baseline flatters the node. Store limit =
min(zmq, pwrite+fsync), retrieve limit = min(zmq, pread); each figure is its best round or window.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import time
from pathlib import Path

import numpy as np

from bench import rawlimits
from bench.results import (
    add_common_args,
    data_dir,
    floors,
    format_bytes,
    format_table,
    new_result,
    progress_for,
    ratios_text,
    run_bench,
    run_part,
)
from bench.stack import bench_client, start_storage
from fabric.client import FabricClient
from kvtb.crc32c import crc32c
from kvtb_proto import nvmeof_pb2

logger = logging.getLogger(__name__)

KIB, MIB = 1 << 10, 1 << 20
SIZES = (64 * KIB, MIB, 16 * MIB)
FLOOR = 0.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench storage", description=__doc__.splitlines()[0])
    add_common_args(parser, "storage")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                        help="value sizes in bytes, comma-separated (default 64 KiB, 1 MiB, 16 MiB)")
    parser.add_argument("--total-mib", type=int, default=256, help="bytes moved per size and round, in MiB")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (the best is kept)")
    parser.add_argument("--concurrency", type=int, default=4, help="commands in flight")
    parser.add_argument("--budget-s", type=float, default=1.0,
                        help="seconds per raw limit (cut into --rounds windows, the best kept)")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or ([64 * KIB, MIB] if args.smoke else list(SIZES))
    if args.smoke:
        args.total_mib, args.rounds, args.budget_s = min(args.total_mib, 4), 1, min(args.budget_s, 0.2)
    return args


def node_throughput(client: FabricClient, value: np.ndarray, count: int, window: int,
                    tag: bytes) -> tuple[float, float]:
    """(store, retrieve) bytes/s of count values through the node, `window` commands in flight."""
    crc = crc32c(value)
    keys = [tag + i.to_bytes(4, "big") for i in range(count)]

    def store(key: bytes):
        return client.submit(nvmeof_pb2.CommandCapsule(
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE, namespace_id=1, key=key,
            value_length=value.nbytes, crc32c=crc, has_crc32c=True), [value])

    def retrieve(key: bytes):
        return client.submit(nvmeof_pb2.CommandCapsule(
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE, namespace_id=1, key=key))

    rates = []
    for op in (store, retrieve):
        inflight, received = [], 0
        start = time.perf_counter()
        for key in keys:
            if len(inflight) >= window:
                received += sum(f.buffer.nbytes for f in inflight.pop(0).result().raise_for_status().frames)
            inflight.append(op(key))
        for future in inflight:
            received += sum(f.buffer.nbytes for f in future.result().raise_for_status().frames)
        seconds = time.perf_counter() - start
        if op is retrieve and received != value.nbytes * count:
            raise RuntimeError(f"retrieved {received} bytes, expected {value.nbytes * count}")
        rates.append(value.nbytes * count / seconds)
    return rates[0], rates[1]


def measure_size(client: FabricClient, directory: Path, size: int, total_bytes: int, window: int,
                 rounds: int, budget_s: float) -> dict:
    """The node and the raw limits at one value size, taking turns over rounds; the best of each."""
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)  # [size] uint8
    count = max(4, total_bytes // size)
    with contextlib.ExitStack() as stack:
        meters = stack.enter_context(rawlimits.path_meters(size, directory, count * size))
        meters |= {f"{name}_threads": stack.enter_context(meter(size, directory, count * size, window))
                   for name, meter in (("pwrite_fsync", rawlimits.PwriteFsync),
                                       ("pread_cached", rawlimits.PreadCached))}
        sampler = rawlimits.Sampler(meters, budget_s / rounds)
        store, retrieve = [], []
        for r in range(rounds):
            sampler()
            tag = size.to_bytes(4, "big") + r.to_bytes(2, "big")
            rates = node_throughput(client, value, count, window, tag)
            store.append(rates[0])
            retrieve.append(rates[1])
            for i in range(count):  # free the round's extents so every round writes alike
                client.delete(1, tag + i.to_bytes(4, "big"))
    best = sampler.best()
    raw = {name: max(best[name], best.get(f"{name}_threads", 0.0)) for name in ("zmq_tcp", "pwrite_fsync",
                                                                                  "pread_cached")}
    limits = rawlimits.put_get_limits(raw)
    return {"count": count, "store_bytes_per_s": max(store), "retrieve_bytes_per_s": max(retrieve),
            "raw_limits_bytes_per_s": raw,
            "threads_bytes_per_s": {k: v for k, v in best.items() if k.endswith("_threads")},
            "store_limit_bytes_per_s": limits["put"], "retrieve_limit_bytes_per_s": limits["get"],
            "store_vs_limit": max(store) / limits["put"], "retrieve_vs_limit": max(retrieve) / limits["get"]}


def table(result: dict) -> str:
    rates = ("store_bytes_per_s", "retrieve_bytes_per_s", "store_limit_bytes_per_s",
             "retrieve_limit_bytes_per_s")
    rows = [[format_bytes(int(size)), *(f"{r[k] / 1e6:.0f}" for k in rates),
             f"{r['store_vs_limit']:.2f}", f"{r['retrieve_vs_limit']:.2f}"]
            for size, r in result["results"]["sizes"].items()]
    head = ["size", "store MB/s", "retrieve MB/s", "store limit", "retrieve limit", "store/limit",
            "retrieve/limit"]
    rows += [[f["part"], f"failed: {f['error'].splitlines()[0][:160]}", "", "", "", "", ""]
             for f in result.get("failed") or []]
    s = result["settings"]
    return (f"{s['concurrency']} commands in flight, best of {s['rounds']} rounds; limit = min(file, zmq)\n"
            f"{format_table(head, rows)}\n\n{ratios_text(result['ratios'])}")


def run(args: argparse.Namespace) -> dict:
    result = new_result("storage", {"sizes": args.sizes, "total_mib": args.total_mib, "rounds": args.rounds,
                                    "concurrency": args.concurrency, "budget_s": args.budget_s, "fsync": True,
                                    "smoke": args.smoke})
    total = args.total_mib * MIB
    sizes = result["results"]["sizes"] = {}
    with progress_for(args, len(args.sizes), "storage") as progress, data_dir(args, "storage") as path:
        node = start_storage(path, "bench", namespaces="key_value", io_threads=max(4, args.concurrency),
                             namespace_size_bytes=max(8 * total, 1 << 30))
        try:
            with bench_client(node.addresses["fabric"], queue_depth=max(args.concurrency, 1),
                              timeout_s=120) as client:
                node_throughput(client, np.zeros(max(args.sizes), np.uint8), 4, args.concurrency, b"warm")
                for i in range(4):  # the warm-up: sockets, files, page cache
                    client.delete(1, b"warm" + i.to_bytes(4, "big"))
                for size in args.sizes:  # a size that fails is in result["failed"], the others still run
                    got = run_part(result, f"{format_bytes(size)} values", lambda: measure_size(
                        client, path, size, total, args.concurrency, args.rounds, args.budget_s))
                    if got is not None:
                        sizes[str(size)] = got
                    progress.update(note=format_bytes(size))
        finally:
            node.stop()
    top = sizes.get(str(max(args.sizes)))  # the largest size's, unless it failed (then in `failed`)
    result["ratios"] = {k: top[k] for k in ("store_vs_limit", "retrieve_vs_limit")} if top else {}
    result["floors"] = floors(result["ratios"], {"store_vs_limit": FLOOR, "retrieve_vs_limit": FLOOR})
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
