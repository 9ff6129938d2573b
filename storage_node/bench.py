"""`kvtb bench storage [--json]`: Store/Retrieve throughput through a real node beside this machine's limits.

Everything is measured in one run, on the same file system: the node (a separate process,
fsync on) is driven by one FabricClient with `--concurrency` commands in flight; the limits
are os.pwrite + os.fsync of the same sizes, os.pread of them (page cache, as the node reads
values it has just stored), and ZeroMQ TCP loopback. Each limit is the better of one thread
and `--concurrency` threads, so the ratios are not flattered by a weak baseline.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import zmq

from kvtb.crc32c import crc32c
from kvtb.launch import ServiceProcess, kvtb_argv
from kvtb_proto import nvmeof_pb2
from fabric.client import FabricClient

KIB, MIB = 1 << 10, 1 << 20
DEFAULT_SIZES = (64 * KIB, MIB, 16 * MIB)


def gbps(nbytes: int, seconds: float) -> float:
    """Throughput in GB/s (10^9 bytes per second)."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _split(count: int, threads: int) -> list[range]:
    return [range(t, count, threads) for t in range(threads)]


def raw_write_fsync(path: str, value: np.ndarray, count: int, threads: int) -> float:
    """GB/s of pwrite + fsync of count values (each fsynced before it counts)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    size = value.nbytes

    def work(indices: range) -> None:
        for i in indices:
            os.pwrite(fd, value, i * size)
            os.fsync(fd)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        wait([pool.submit(work, r) for r in _split(count, threads)])
    elapsed = time.perf_counter() - start
    os.close(fd)
    return gbps(size * count, elapsed)


def raw_pread(path: str, size: int, count: int, threads: int) -> float:
    """GB/s of os.preadv of count values into fresh buffers."""
    fd = os.open(path, os.O_RDONLY)

    def work(indices: range) -> None:
        for i in indices:
            buf = np.empty(size, np.uint8)
            os.preadv(fd, [buf], i * size)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        wait([pool.submit(work, r) for r in _split(count, threads)])
    elapsed = time.perf_counter() - start
    os.close(fd)
    return gbps(size * count, elapsed)


def raw_zmq(value: np.ndarray, count: int) -> float:
    """GB/s of one-way ZeroMQ TCP loopback (PUSH -> PULL, copy=False), one message per value."""
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    push.send(b"warm"), pull.recv()

    def sink() -> None:
        for _ in range(count):
            pull.recv(copy=False)

    thread = threading.Thread(target=sink)
    start = time.perf_counter()
    thread.start()
    for _ in range(count):
        push.send(value, copy=False)
    thread.join()
    elapsed = time.perf_counter() - start
    push.close(0), pull.close(0)
    return gbps(value.nbytes * count, elapsed)


def node_throughput(client: FabricClient, nsid: int, value: np.ndarray, count: int, window: int,
                    tag: bytes) -> tuple[float, float]:
    """(store GB/s, retrieve GB/s) through the node with `window` commands in flight."""
    crc = crc32c(value)
    keys = [tag + i.to_bytes(4, "big") for i in range(count)]

    def store(key: bytes):
        return client.submit(nvmeof_pb2.CommandCapsule(
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE, namespace_id=nsid, key=key,
            value_length=value.nbytes, crc32c=crc, has_crc32c=True), [value])

    def retrieve(key: bytes):
        return client.submit(nvmeof_pb2.CommandCapsule(
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE, namespace_id=nsid, key=key))

    results = []
    for op in (store, retrieve):
        inflight, received = [], 0
        start = time.perf_counter()
        for key in keys:
            if len(inflight) >= window:
                done = inflight.pop(0).result().raise_for_status()
                received += sum(f.buffer.nbytes for f in done.frames)
            inflight.append(op(key))
        for future in inflight:
            done = future.result().raise_for_status()
            received += sum(f.buffer.nbytes for f in done.frames)
        elapsed = time.perf_counter() - start
        if op is retrieve and received != value.nbytes * count:
            raise RuntimeError(f"retrieved {received} bytes, expected {value.nbytes * count}")
        results.append(gbps(value.nbytes * count, elapsed))
    return results[0], results[1]


def measure_size(client: FabricClient, work_dir: str, size: int, count: int, window: int,
                 rounds: int) -> dict:
    """Raw limits and node throughput for one size, interleaved over rounds; best round of each."""
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)  # [size] uint8
    raw_path = os.path.join(work_dir, "raw.data")
    best: dict[str, float] = {}

    def keep(name: str, gb_s: float) -> None:
        best[name] = max(best.get(name, 0.0), gb_s)

    for r in range(rounds):
        keep("limit_pwrite_fsync_gbps", max(raw_write_fsync(raw_path, value, count, t) for t in (1, window)))
        keep("limit_pread_gbps", max(raw_pread(raw_path, size, count, t) for t in (1, window)))
        keep("limit_zmq_loopback_gbps", raw_zmq(value, count))
        os.unlink(raw_path)
        tag = size.to_bytes(4, "big") + r.to_bytes(2, "big")
        store, retrieve = node_throughput(client, 1, value, count, window, tag)
        keep("store_gbps", store)
        keep("retrieve_gbps", retrieve)
        for i in range(count):  # free the round's extents so every round writes alike
            client.delete(1, tag + i.to_bytes(4, "big"))
    store_limit = min(best["limit_pwrite_fsync_gbps"], best["limit_zmq_loopback_gbps"])
    retrieve_limit = min(best["limit_pread_gbps"], best["limit_zmq_loopback_gbps"])
    return {"count": count, **best, "store_limit_gbps": store_limit, "retrieve_limit_gbps": retrieve_limit,
            "store_vs_limit": best["store_gbps"] / store_limit,
            "retrieve_vs_limit": best["retrieve_gbps"] / retrieve_limit,
            "store_vs_pwrite_fsync": best["store_gbps"] / best["limit_pwrite_fsync_gbps"],
            "retrieve_vs_pread": best["retrieve_gbps"] / best["limit_pread_gbps"]}


def run(sizes: list[int], total_bytes: int, window: int, rounds: int, work_dir: str) -> dict:
    """Start a node, warm up, measure every size; return the report."""
    env = {"KVTB_STORAGE_DATA_DIR": os.path.join(work_dir, "node"),
           "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0", "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0",
           "KVTB_STORAGE_NAMESPACES": "key_value",
           "KVTB_STORAGE_NAMESPACE_SIZE_BYTES": str(max(8 * total_bytes, 1 << 30)),
           "KVTB_STORAGE_IO_THREADS": str(max(4, window))}
    node = ServiceProcess("storage-bench", kvtb_argv("serve", "storage", "--log-level", "WARNING"),
                          os.path.join(work_dir, "storage.log"), env=env)
    node.start(timeout_s=60)
    report: dict = {"window": window, "rounds": rounds, "total_bytes_per_size": total_bytes,
                    "fsync": True, "statistic": "best round of each figure",
                    "limit": "min(raw disk figure, zmq loopback): a value crosses both", "sizes": {}}
    try:
        with FabricClient(node.addresses["fabric"], "nqn.2026-11.org.kvtestbed:bench",
                          queue_depth=max(window, 1), timeout_s=120) as client:
            measure_size(client, work_dir, max(sizes), 4, window, 1)  # warm-up: sockets, page cache, files
            for size in sizes:
                count = max(4, total_bytes // size)
                report["sizes"][str(size)] = measure_size(client, work_dir, size, count, window, rounds)
    finally:
        node.stop()
    top = report["sizes"][str(max(sizes))]
    report["ratios"] = {"size_bytes": max(sizes), "store_vs_limit": top["store_vs_limit"],
                        "retrieve_vs_limit": top["retrieve_vs_limit"], "floor": 0.5}
    return report


def table(report: dict) -> str:
    """The report as a readable table."""
    header = (f"{'size':>10} {'store':>7} {'retrieve':>8} {'pwrite+fsync':>12} {'pread':>7} {'zmq':>6} "
              f"{'store/limit':>11} {'retrieve/limit':>14}   (GB/s; window {report['window']}, "
              f"best of {report['rounds']} rounds; limit = min(disk, zmq))")
    rows = [header]
    for size, r in report["sizes"].items():
        rows.append(f"{int(size):>10} {r['store_gbps']:7.2f} {r['retrieve_gbps']:8.2f} "
                    f"{r['limit_pwrite_fsync_gbps']:12.2f} {r['limit_pread_gbps']:7.2f} "
                    f"{r['limit_zmq_loopback_gbps']:6.2f} {r['store_vs_limit']:11.2f} "
                    f"{r['retrieve_vs_limit']:14.2f}")
    ratios = report["ratios"]
    rows.append(f"at {ratios['size_bytes']} bytes: store/limit {ratios['store_vs_limit']:.2f}, "
                f"retrieve/limit {ratios['retrieve_vs_limit']:.2f} (floor {ratios['floor']})")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb bench storage", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                        help="value sizes in bytes, comma-separated")
    parser.add_argument("--total-mib", type=int, default=256, help="bytes moved per size and round, in MiB")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (limits, node) per size")
    parser.add_argument("--concurrency", type=int, default=4, help="commands in flight")
    parser.add_argument("--work-dir", help="where the node and the raw files live (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="kvtb-bench-storage-")
    try:
        report = run(sizes, args.total_mib * MIB, args.concurrency, args.rounds, work_dir)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(json.dumps(report) if args.json else table(report))
    return 0
