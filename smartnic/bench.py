"""`kvtb bench smartnic [--json]`: trigger-to-fire latency, and PUT/GET throughput beside raw limits.

The agent runs in this process (its real engine, watcher and data path) against a real storage
node process; the counter stores come from a child process, as the compute node's would, each
with its CLOCK_MONOTONIC timestamp, so trigger-to-fire is measured from the store itself. A
transfer's round is timed by such a child too, from its store until it sees the round's last
completion counted (`smartnic.bench_compute`), so no polling takes the agent's GIL.
Raw limits are measured in the same run on the storage node's disk, each moving as many distinct
bytes as a transfer does (`--total-mib`): ZeroMQ tcp loopback between two processes (and, for
reference, within one), pread of a cached file, pwrite + fsync. The PUT limit is min(zmq,
pwrite+fsync); the GET limit is min(zmq, pread). Beside them, the bare path (`kvtb.bench.barepath`):
the same gather, ZeroMQ hop, writes and fdatasyncs, or send and scatter, done by two bare loops
with no service around them. Limits, bare path and transfers take turns: before each of the
`--rounds` rounds, every meter measures one window (`--budget-s` per meter in all). A transfer
keeps its best round, and a meter its best window; every round's rate is kept too
(`rounds_bytes_per_s`) and printed as worst / median / best, since rounds spread widely on a
shared machine. Over every round and window the whole machine's busy CPU is read too
(`kvtb.bench.cpu_use`): the second table gives each one's core-µs per MiB, and how far the
path's cost lets it go with every core on it.
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvtb.bench import barepath, cpu_use, rawlimits
from kvtb.bench.chunk_layout import RANGES_PER_CHUNK, strided_ranges
from kvtb.bench.common import add_common_args, new_result
from kvtb.bench.output import emit_json, format_bytes, format_table, write_json
from kvtb.bench.stats import percentile
from kvtb.heap import keep_large_buffers_in_the_heap
from kvtb.launch import ServiceProcess, kvtb_argv
from kvtb_proto import nvmeof_pb2 as pb
from fabric import chunk_format as cf
from smartnic.agent import Agent
from smartnic.bench_compute import ComputeStandIn, store_at_random_gaps
from smartnic.datapath import ChunkRef
from smartnic.watcher import CounterWork, DataWork
from hostmem.region import Region
from smartnic.settings import SmartNicSettings, StorageNodeRef
from fabric.client import FabricClient

logger = logging.getLogger(__name__)

TRIGGER, FIRED = 0, 1   # counters of the trigger-to-fire region
PUT_TRIGGER, PUT_DONE, GET_DONE, GET_TRIGGER = 0, 1, 2, 3  # counters of a transfer's region


def _wait(region: Region, counter: int, total: int, timeout_s: float = 120.0) -> None:
    """Until the counter reaches total; polls every millisecond (untimed waits only: a transfer is
    timed by the compute stand-in's process, see `smartnic.bench_compute`)."""
    deadline = time.monotonic() + timeout_s
    while region.counter_total(counter) < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"counter {counter} stuck at {region.read_counter(counter)}, wanted {total}")
        time.sleep(0.001)


def trigger_latency(agent: Agent, samples: int) -> dict:
    """Store-to-fire latency in µs over `samples` counter stores from another process."""
    region = Region.create(f"kvtb-bench-{uuid.uuid4().hex[:8]}", 1 << 16, 0, 16)
    reg = agent.regions.register(region.name, region.size, "bench", 0, 16)
    fired: dict[int, int] = {}
    agent.engine.on_fire.append(lambda entry, ns: fired.__setitem__(entry.threshold, ns))
    try:
        works = [(TRIGGER, i, CounterWork("add", FIRED, 1), None) for i in range(1, samples + 1)]
        agent.engine.queue(reg, works)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=store_at_random_gaps,
                            args=(region.name, region.size, 0, 16, TRIGGER, samples, 1, queue))
        child.start()
        stamps = queue.get(timeout=120)
        child.join()
        _wait(region, FIRED, samples)
    finally:
        agent.engine.on_fire.clear()
        agent.deregister(reg.region_id, "bench")
        region.close()
    latencies = [(fired[i + 1] - t) / 1000 for i, t in enumerate(stamps)]
    return {"samples": samples, "p50_us": percentile(latencies, 50), "p99_us": percentile(latencies, 99),
            "mean_us": float(np.mean(latencies))}


def transfer(agent: Agent, chunk_bytes: int, total_bytes: int, rounds: int,
             before_round: Callable[[], None] | None = None) -> dict:
    """PUT then GET `total_bytes` in chunks of `chunk_bytes` through the engine; best bytes/s over rounds.

    As the compute node does, each round's operations are queued as triggered operations first
    (the setup the CPU does once), and a counter store then fires them all: the clock runs from
    that store until the last completion is counted. before_round() runs before each round (the
    raw limits' windows, so that limits and transfers take turns).
    """
    count = max(2, total_bytes // chunk_bytes)
    area = count * chunk_bytes
    size = 2 * area + 4096
    region = Region.create(f"kvtb-bench-{uuid.uuid4().hex[:8]}", size, size - 4096, 4)
    region.array[:area] = np.random.default_rng(0).integers(0, 256, area, dtype=np.uint8)
    region.array[area:2 * area] = 0  # touched once, as a KV pool in use is: no first-touch faults timed
    reg = agent.regions.register(region.name, size, "bench", size - 4096, 4)
    put_s, get_s = [], []
    cpu = {"put": cpu_use.CpuTally(), "get": cpu_use.CpuTally()}

    def fire(trigger: int, works: list, done: int, round_number: int, op: str) -> float:
        """Queue works on trigger >= round_number; the compute stand-in stores it and times the
        round until its every completion is counted. The machine's busy CPU over the round is
        added to cpu[op]."""
        agent.engine.queue(reg, [(trigger, round_number, work, done) for work in works])
        window = cpu_use.Window()
        seconds = compute.fire(trigger, round_number, done, round_number * count)
        cpu[op].close(window, area)
        return seconds

    try:
        with ComputeStandIn(region, size - 4096) as compute:
            for r in range(rounds):
                if before_round is not None:
                    before_round()
                refs = [ChunkRef("bench", f"{chunk_bytes}-{r}", i, 0, 0) for i in range(count)]
                puts = [DataWork("put", ref, strided_ranges(0, i, count, chunk_bytes), (0, 0))
                        for i, ref in enumerate(refs)]
                put_s.append(fire(PUT_TRIGGER, puts, PUT_DONE, r + 1, "put"))
                gets = [DataWork("get", refs[c.chunk_index],
                                 strided_ranges(area, c.chunk_index, count, chunk_bytes), (0, 0), c)
                        for c in agent.lookup("bench", refs[0].context_id)]
                get_s.append(fire(GET_TRIGGER, gets, GET_DONE, r + 1, "get"))
                failed = region.read_counter(PUT_DONE)[1] + region.read_counter(GET_DONE)[1]
                assert failed == 0, f"{failed} transfers failed"
                assert bytes(region.view(area, area)) == bytes(region.view(0, area)), "GET gave other bytes"
                agent.drop_context("bench", refs[0].context_id)
    finally:
        agent.deregister(reg.region_id, "bench")
        region.close()
    return {"chunk_bytes": chunk_bytes, "chunks": count, "ranges_per_chunk": RANGES_PER_CHUNK,
            "rounds": rounds,
            "put_bytes_per_s": area / min(put_s), "get_bytes_per_s": area / min(get_s),
            "rounds_bytes_per_s": {"put": [area / s for s in put_s], "get": [area / s for s in get_s]},
            "cpu": {"put": cpu["put"].figures(best=put_s.index(min(put_s))),
                    "get": cpu["get"].figures(best=get_s.index(min(get_s)))}}


def direct(fabric_address: str, chunk_bytes: int, total_bytes: int, rounds: int) -> dict:
    """The storage node alone: values of the same size as the agent's, as one joined frame each (as
    the agent sends a chunk of small ranges), stored and retrieved by a bare FabricClient that
    copies and checks nothing itself; its Retrieves skip the node's guard check, as the agent's do."""
    count = max(2, total_bytes // chunk_bytes)
    data = np.random.default_rng(1).integers(0, 256, count * chunk_bytes, dtype=np.uint8)
    view = memoryview(data)
    client = FabricClient(fabric_address, "nqn.2026-11.org.kvtestbed:bench-direct")
    client.connect()
    put_s, get_s = [], []
    try:
        for r in range(rounds):
            keys = [cf.chunk_key("direct", "bench", str(r), i) for i in range(count)]
            start = time.perf_counter()
            futures = [client.submit(pb.CommandCapsule(
                command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1, key=key,
                value_length=chunk_bytes, crc32c=cf.crc32c_of(frames), has_crc32c=True), frames)
                for key, frames in ((k, [view[i * chunk_bytes:(i + 1) * chunk_bytes]])
                                    for i, k in enumerate(keys))]
            for f in futures:
                f.result().raise_for_status()
            put_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            futures = [client.submit(pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE,
                                                       namespace_id=1, key=k, skip_guard_check=True))
                       for k in keys]
            for f in futures:
                f.result().raise_for_status()
            get_s.append(time.perf_counter() - start)
            for k in keys:
                client.delete(1, k)
    finally:
        client.close()
    moved = count * chunk_bytes
    return {"put_bytes_per_s": moved / min(put_s), "get_bytes_per_s": moved / min(get_s)}


def measure(args, data_dir: Path) -> tuple[dict, list[dict]]:
    """Trigger-to-fire, and per size the transfers through an in-process agent and a real storage
    node process, taking turns with windows of the raw limits; then the storage node alone."""
    log = Path(args.out) / "storage.log"
    storage = ServiceProcess("storage-bench", kvtb_argv("serve", "storage"), log, env={
        "KVTB_STORAGE_DATA_DIR": str(data_dir / "storage"), "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0",
        "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0", "KVTB_STORAGE_NODE_NAME": "bench"})
    storage.start()
    node = StorageNodeRef("bench", storage.addresses["admin"], storage.addresses["fabric"])
    agent = Agent(SmartNicSettings(listen_address="127.0.0.1:0", storage_nodes=(node,),
                                   queue_bound=max(512, args.trigger_samples), eviction_policy="timer"))
    try:
        agent.start()
        trigger = trigger_latency(agent, args.trigger_samples)
        p50, p99 = agent.stats.percentiles()
        trigger["agent_observe_to_fire"] = {"p50_us": p50, "p99_us": p99}
        transfers = [transfer_beside_limits(agent, node.fabric_address, mib << 20, args.total_mib << 20,
                                            args.rounds, args.budget_s, data_dir) for mib in args.sizes_mib]
        return trigger, transfers
    finally:
        agent.close()
        storage.stop()


def transfer_beside_limits(agent: Agent, fabric_address: str, chunk_bytes: int, total_bytes: int,
                           rounds: int, budget_s: float, data_dir: Path) -> dict:
    """transfer() with a window of every raw limit and of the bare path before each round (on
    data_dir's disk, over as many distinct bytes as a round moves; budget_s per meter in all),
    then the storage node alone (`direct`), and the ratios."""
    with rawlimits.path_meters(chunk_bytes, data_dir, total_bytes) as limits, \
            barepath.meters(chunk_bytes, data_dir, total_bytes, RANGES_PER_CHUNK) as bare:
        sampler = rawlimits.Sampler({**limits, **bare}, budget_s / rounds)
        t = transfer(agent, chunk_bytes, total_bytes, rounds, before_round=sampler)
    t["storage_node_direct"] = direct(fabric_address, chunk_bytes, total_bytes, rounds)
    add_ratios(t, sampler.best())
    t["cpu"].update(sampler.cpu())
    add_cpu_ceilings(t)
    return t


def add_cpu_ceilings(t: dict) -> None:
    """Per op, the rate the path's (and the bare path's) CPU cost per MiB in its best round
    allows if every core worked on it all the time, and that rate against the op's limit: how
    far the cores alone let it go, whatever its scheduling."""
    for op in ("put", "get"):
        for who in (op, f"bare_{op}"):
            ceiling = cpu_use.ceiling_bytes_per_s(_best_window(t, who)["us_per_mib"])
            limit = t[f"{op}_limit_bytes_per_s"]
            t[f"{who}_cpu_ceiling_bytes_per_s"] = ceiling
            t[f"{who}_cpu_ceiling_vs_limit"] = None if ceiling is None else ceiling / limit


def add_ratios(t: dict, measured: dict[str, float]) -> None:
    """Fill a transfer's limits, bare path and ratios from the meters' best windows (it has
    storage_node_direct already)."""
    alone = t["storage_node_direct"]
    limits = {name: rate for name, rate in measured.items() if not name.startswith("bare_")}
    t["raw_limits_bytes_per_s"] = limits
    t["put_limit_bytes_per_s"] = min(limits["zmq_tcp"], limits["pwrite_fsync"])
    t["get_limit_bytes_per_s"] = min(limits["zmq_tcp"], limits["pread_cached"])
    t["bare_path_bytes_per_s"] = {op: measured[f"bare_{op}"] for op in ("put", "get")}
    for op in ("put", "get"):
        bare = t["bare_path_bytes_per_s"][op]
        t[f"{op}_vs_limit"] = t[f"{op}_bytes_per_s"] / t[f"{op}_limit_bytes_per_s"]
        t[f"{op}_vs_direct"] = t[f"{op}_bytes_per_s"] / alone[f"{op}_bytes_per_s"]
        t[f"{op}_vs_bare"] = t[f"{op}_bytes_per_s"] / bare
        t[f"bare_{op}_vs_limit"] = bare / t[f"{op}_limit_bytes_per_s"]


def table_row(t: dict) -> list:
    alone, bare = t["storage_node_direct"], t["bare_path_bytes_per_s"]
    return [f"{t['chunk_bytes'] >> 20} MiB",
            *(v / 1e6 for v in (t["put_bytes_per_s"], alone["put_bytes_per_s"], bare["put"],
                                t["put_limit_bytes_per_s"])),
            t["put_vs_limit"],
            *(v / 1e6 for v in (t["get_bytes_per_s"], alone["get_bytes_per_s"], bare["get"],
                                t["get_limit_bytes_per_s"])),
            t["get_vs_limit"]]


def rounds_line(t: dict) -> str:
    """Every round's rate of one size, worst, median and best: the best alone hides how far the
    rounds spread on a shared machine."""
    def spread(rates: list[float]) -> str:
        return " / ".join(f"{v / 1e6:.0f}" for v in (min(rates), float(np.median(rates)), max(rates)))

    rounds = t["rounds_bytes_per_s"]
    return (f"{format_bytes(t['chunk_bytes'])} rounds, MB/s worst / median / best: "
            f"PUT {spread(rounds['put'])}, GET {spread(rounds['get'])}")


def _best_window(t: dict, who: str) -> dict:
    """CPU figures of the round or window whose rate is reported for who (a path op or a meter)."""
    return t["cpu"][who]["best_window"]


def binding_limit(t: dict, op: str) -> str:
    """The name of the raw limit that bounds op (the slower of the two it is the minimum of)."""
    names = ("zmq_tcp", "pwrite_fsync") if op == "put" else ("zmq_tcp", "pread_cached")
    return min(names, key=lambda name: t["raw_limits_bytes_per_s"][name])


def cpu_table(transfers: list[dict]) -> str:
    """The whole machine's busy CPU per MiB moved: the path, the bare path and the binding raw
    limit, the path's mean busy cores, and how far its CPU cost lets it go against the limit;
    each in the round or window whose rate the throughput table shows."""
    def cell(v, fmt: str = "{:.0f}") -> str:
        return "?" if v is None else fmt.format(v)

    rows = []
    for t in transfers:
        row = [format_bytes(t["chunk_bytes"])]
        for op in ("put", "get"):
            path = _best_window(t, op)
            row += [cell(path["us_per_mib"]), cell(_best_window(t, f"bare_{op}")["us_per_mib"]),
                    cell(_best_window(t, binding_limit(t, op))["us_per_mib"]),
                    cell(path["busy_cores"], "{:.2f}"), cell(t[f"{op}_cpu_ceiling_vs_limit"], "{:.2f}")]
        rows.append(row)
    head = ["chunk", "PUT path", "bare path", "limit", "busy cores", "CPU ceiling/limit",
            "GET path", "bare path", "limit", "busy cores", "CPU ceiling/limit"]
    return ("CPU of the whole machine per MiB moved (core-µs); CPU ceiling = every core on the "
            f"path all the time ({os.cpu_count()} cores)\n" + format_table(head, rows))


def run(args) -> dict:
    keep_large_buffers_in_the_heap()  # the agent runs in this process: as its main sets it up, first
    temp = None if args.data_dir else tempfile.TemporaryDirectory(prefix="kvtb-bench-smartnic-")
    data_dir = Path(args.data_dir or temp.name)
    result = new_result("smartnic", {"sizes_mib": args.sizes_mib, "total_mib": args.total_mib,
                                     "rounds": args.rounds, "trigger_samples": args.trigger_samples,
                                     "ranges_per_chunk": RANGES_PER_CHUNK, "fsync": True,
                                     "load_average_1m_at_start": os.getloadavg()[0]})
    try:
        trigger, transfers = measure(args, data_dir)
    finally:
        if temp is not None:
            temp.cleanup()
    rows = [table_row(t) for t in transfers]
    result["results"] = {"trigger_to_fire": trigger, "transfers": transfers}
    for op in ("put", "get"):
        result["ratios"][f"{op}_vs_limit"] = min(t[f"{op}_vs_limit"] for t in transfers)
        result["ratios"][f"{op}_vs_storage_node_alone"] = min(t[f"{op}_vs_direct"] for t in transfers)
        result["ratios"][f"{op}_vs_bare_path"] = min(t[f"{op}_vs_bare"] for t in transfers)
        result["ratios"][f"bare_{op}_vs_limit"] = min(t[f"bare_{op}_vs_limit"] for t in transfers)
        ceiling = _worst(t[f"{op}_cpu_ceiling_vs_limit"] for t in transfers)
        if ceiling is not None:  # unknown where /proc/stat cannot be read
            result["ratios"][f"{op}_cpu_ceiling_vs_limit"] = ceiling
    result["ratios"]["floor"] = 0.5
    result["table"] = format_table(["chunk", "PUT MB/s", "node alone", "bare path", "raw limit", "ratio",
                                    "GET MB/s", "node alone", "bare path", "raw limit", "ratio"], rows)
    return result


def _worst(values) -> float | None:
    """The least of values, or None when any is unknown."""
    values = list(values)
    return None if any(v is None for v in values) else min(values)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb bench smartnic", description=__doc__.splitlines()[0])
    add_common_args(parser, "smartnic")
    parser.add_argument("--sizes-mib", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument("--total-mib", type=int, default=128, help="bytes moved per size and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per size (the best is kept)")
    parser.add_argument("--trigger-samples", type=int, default=1000)
    parser.add_argument("--budget-s", type=float, default=1.0,
                        help="seconds per raw limit and bare path (cut into --rounds windows, the best kept)")
    parser.add_argument("--data-dir", help="where the storage node and raw limits write (default: temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    result = run(args)
    write_json(args.out, "smartnic.json", result)
    if args.json:
        emit_json(result)
    else:
        tf = result["results"]["trigger_to_fire"]
        print(f"trigger-to-fire: p50 {tf['p50_us']:.0f} µs, p99 {tf['p99_us']:.0f} µs "
              f"({tf['samples']} stores)")
        print(result["table"])
        for t in result["results"]["transfers"]:
            print(rounds_line(t))
        print()
        print(cpu_table(result["results"]["transfers"]))
        r = result["ratios"]
        print(f"ratios: put_vs_limit {r['put_vs_limit']:.2f}, get_vs_limit {r['get_vs_limit']:.2f} "
              f"(floor 0.5); the bare path against the same limits: PUT {r['bare_put_vs_limit']:.2f}, "
              f"GET {r['bare_get_vs_limit']:.2f}")
    return 0
