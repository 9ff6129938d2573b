"""`kvtb bench smartnic`: trigger-to-fire latency, and the agent's PUT/GET beside this machine's limits.

The agent runs in this process (its real engine, watcher and data path) against a real storage
node process. Counter stores come from a child process, as the compute node's would: trigger-to-
fire (`bench.trigger`) is the standing PUTs' from each store's CLOCK_MONOTONIC stamp in the
block's descriptor, idle and under a decode's load (ceilings p50 50 µs, p99 500 µs); a transfer's
round is timed there (`bench.compute_standin`), from its store until its last completion is
counted, so no polling takes the agent's GIL. Each chunk is gathered from 128 strided ranges of a
plain region (a paged pool's block is one extent). Before each of `--rounds` rounds every raw limit (`bench.rawlimits`: ZeroMQ tcp between
two processes, pwrite+fsync, cached pread, on the storage node's disk, as many distinct bytes as
a round moves) measures one window; a transfer keeps its best round and a limit its best window,
and every round's rate is kept too. PUT limit = min(zmq, pwrite+fsync); GET limit = min(zmq,
pread). Beside them, the storage node alone: the same values stored and retrieved by a bare
fabric client (the `cpu` mode of `kvtb simulate --calibrate`).

A whole context (`--context-tokens`, 2,048: 64 blocks of SmolLM2's KV, about 94 MB) is restored
through the default agent as the compute node asks for it, by bulk GET layer group by layer group
(`bench.context_restore`), beside the ZeroMQ loopback limit measured in the same run:
`context_restore_vs_zmq` (floor RESTORE_FLOOR) is the path's figure for GET.

Security, side by side in the same run (`SECURITY`): each mode has its own storage node process
and agent, and the modes' rounds take turns. "secure" is the default (fabric authentication and
sealed capsules, and the KV MAC): the whole path's figures are its. "open" has both off;
"curve" adds ZeroMQ CURVE encryption to "secure". Ratios `put_secure_vs_open` and
`get_secure_vs_open` (at 16 MiB, floor SECURITY_FLOOR) say what the default security costs.

Chunks are stored as the product stores a block (`fabric.chunk_format`, version recorded in the
settings): its KV in KV_PARTS equal parts, each with its own MAC, KV_PARTS being the real model's
layers (SmolLM2-135M: 30; the agent's standing PUTs and the `cpu` policy MAC a block per layer).
The agent's one-off PUT of a plain chunk would store one part (one MAC), so the benchmark's agents
store every plain chunk in KV_PARTS parts (`LayerParts`). A chunk of a nominal size (the label,
e.g. 16 MiB) holds the largest KV that splits into KV_PARTS parts and RANGES_PER_CHUNK rows
(`kv_bytes`: 256 bytes short of 64 KiB or 16 MiB); rates are of the bytes really moved. A size
whose transfer raised is reported failed with its error (`failed`), the other sizes still run.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import numpy as np

from bench import trigger
from bench.compute_standin import ComputeStandIn
from bench.context_restore import context_restore, smollm2_layout
from bench.rawlimits import Sampler, path_meters, put_get_limits
from bench.results import (
    add_common_args,
    data_dir,
    fail,
    failed_text,
    floors,
    format_bytes,
    format_table,
    new_result,
    progress_for,
    ratios_text,
    run_bench,
)
from bench.nic_layouts import LAYOUTS, OWN_CORE, layout_of, pinned
from bench.stack import bench_client, start_storage
from fabric import chunk_format as cf
from hostmem.region import Region
from kvtb.heap import keep_large_buffers_in_the_heap
from kvtb import placement
from kvtb.placement import current_cpus, format_cpus
from kvtb_proto import nvmeof_pb2 as pb
from smartnic.agent import Agent
from smartnic.datapath import ChunkRef
from smartnic.settings import SmartNicSettings, StorageNodeRef
from smartnic.watcher import DataWork

logger = logging.getLogger(__name__)

RANGES_PER_CHUNK = 128  # one [layer, K|V, kv_head] row of the chunk's tokens each, as in a KV pool
KV_PARTS = smollm2_layout(1).num_layers  # a block's KV is MACed per layer: the real model's 30
PUT_TRIGGER, PUT_DONE, GET_DONE, GET_TRIGGER = 0, 1, 2, 3  # counters of a transfer's region
FLOOR = 0.5
RESTORE_FLOOR = 0.7  # a whole context restored by bulk GET / ZeroMQ loopback
# the NIC's own cores (issue 30's targets): trigger-to-fire ceilings, idle and under load, and the floor
# of a whole context's restore against ZeroMQ loopback, in placement nic (and the own-core what-if)
NIC_TRIGGER_CEILINGS = {"p50": 20.0, "p99": 200.0}
NIC_RESTORE_FLOOR = 0.7
# Each mode of the data path: the default security, none, and the encrypted option.
SECURITY = {"secure": {"fabric_security": "auth", "kv_mac": True},
            "open": {"fabric_security": "off", "kv_mac": False},
            "curve": {"fabric_security": "curve", "kv_mac": True}}
SECURITY_FLOOR = 0.75   # put/get_secure_vs_open at 16 MiB chunks (goal 0.9)
SECURITY_BYTES = 16 << 20


def strided_ranges(base: int, index: int, count: int, chunk_bytes: int,
                   ranges_per_chunk: int = RANGES_PER_CHUNK) -> tuple[tuple[int, int], ...]:
    """The (offset, length) rows of chunk `index` of `count`: row k at base + (k * count + index) * row.

    ValueError unless the chunk splits into ranges_per_chunk rows of whole bytes."""
    row, rest = divmod(chunk_bytes, ranges_per_chunk)
    if row == 0 or rest:
        raise ValueError(f"a chunk of {chunk_bytes} bytes does not split into {ranges_per_chunk} equal rows")
    return tuple((base + (k * count + index) * row, row) for k in range(ranges_per_chunk))


def kv_bytes_of(chunk_bytes: int, kv_parts: int = KV_PARTS, ranges: int = RANGES_PER_CHUNK) -> int:
    """The KV a chunk of nominal size chunk_bytes holds: the most bytes, at most chunk_bytes, that
    split into kv_parts equal parts (one MAC each) and `ranges` equal rows (ValueError when none)."""
    unit = math.lcm(kv_parts, ranges)
    if chunk_bytes < unit:
        raise ValueError(f"a chunk of {chunk_bytes} bytes holds no {kv_parts} parts of {ranges} rows")
    return chunk_bytes - chunk_bytes % unit


class LayerParts:
    """An agent's Datapath whose PUTs store the KV in kv_parts parts, each with its own MAC, as the
    product stores a block (the agent's standing PUT passes the layout's layers; its one-off PUT of
    a plain chunk, which the benchmark's transfers use, would pass 1). Everything else is the
    Datapath's own."""

    def __init__(self, datapath, kv_parts: int = KV_PARTS):
        self._datapath, self.kv_parts = datapath, kv_parts

    def put(self, region, header, key, runs, done, kv_parts: int = 1) -> None:
        return self._datapath.put(region, header, key, runs, done, kv_parts=max(kv_parts, self.kv_parts))

    def __getattr__(self, name: str):
        return getattr(self._datapath, name)


def chunk_format_settings() -> dict:
    """What a result records of how its chunks were stored."""
    return {"chunk_format_version": cf.VERSION, "kv_parts": KV_PARTS, "ranges_per_chunk": RANGES_PER_CHUNK}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench smartnic", description=__doc__.splitlines()[0])
    add_common_args(parser, "smartnic")
    parser.add_argument("--sizes-mib", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument("--total-mib", type=int, default=128, help="bytes moved per size and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per size (the best is kept)")
    parser.add_argument("--trigger-samples", type=int, default=1000)
    parser.add_argument("--budget-s", type=float, default=1.0,
                        help="seconds per raw limit (cut into --rounds windows, the best kept)")
    parser.add_argument("--context-tokens", type=int, default=2048, help="tokens of the context restored whole")
    parser.add_argument("--context-rounds", type=int, default=3, help="restores of that context (the best is kept)")
    parser.add_argument("--placements", nargs="+", choices=LAYOUTS, default=None,
                        help="where the agent, storage and compute run, side by side (bench.nic_layouts; default: "
                             "shared nic on 2 CPUs or more, else shared; nic-own-core: a what-if)")
    parser.add_argument("--fire-ring", nargs="+", choices=("off", "on"), default=["off"],
                        help="the agent's watcher_fire_ring, each in the same run (default off; `off on`: every "
                             "placement twice, the ring's as `<placement>+ring`, compared as <figure>@<placement>"
                             "_ring_vs_off)")
    args = parser.parse_args(argv)
    args.fire_ring = list(dict.fromkeys(args.fire_ring))
    if args.placements is None:
        args.placements = list(placement.PLACEMENTS) if len(current_cpus()) >= 2 else ["shared"]
    if args.smoke:
        args.sizes_mib, args.total_mib, args.rounds = [1], min(args.total_mib, 4), 1
        args.trigger_samples, args.budget_s = min(args.trigger_samples, 50), min(args.budget_s, 0.2)
        args.context_tokens, args.context_rounds = min(args.context_tokens, 128), 1
    return args


@contextlib.contextmanager
def agent_beside_storage(directory: Path, queue_bound: int, security: str = "secure", agent_settings: dict | None = None,
                         storage_cpus: tuple[int, ...] = ()) -> Iterator[tuple[Agent, str]]:
    """An agent in this process with one storage node process (on storage_cpus; (): any), both in one of
    the SECURITY modes, the agent with `agent_settings` too; yields (agent, the node's fabric address)."""
    mode = SECURITY[security]
    storage = start_storage(directory, f"bench-{security}", fabric_security=mode["fabric_security"],
                            **({"cpus": format_cpus(storage_cpus)} if storage_cpus else {}))
    try:
        node = StorageNodeRef("bench", storage.addresses["admin"], storage.addresses["fabric"])
        agent = Agent(SmartNicSettings(listen_address="127.0.0.1:0", storage_nodes=(node,),
                                       queue_bound=queue_bound, eviction_policy="timer", **mode,
                                       **(agent_settings or {})))
        agent.datapath = LayerParts(agent.datapath)  # a MAC per layer, as a block's
        try:
            agent.start()
            yield agent, node.fabric_address
        finally:
            agent.close()
    finally:
        storage.stop()


@contextlib.contextmanager
def agents_beside_storage(directory: Path, queue_bound: int,
                          modes=tuple(SECURITY)) -> Iterator[dict[str, tuple[Agent, str]]]:
    """agent_beside_storage() for each security mode at once: {mode: (agent, fabric address)}."""
    with contextlib.ExitStack() as stack:
        yield {m: stack.enter_context(agent_beside_storage(directory, queue_bound, m)) for m in modes}


def _wait(region: Region, counter: int, total: int, timeout_s: float = 120.0) -> None:
    """Until the counter reaches total (untimed waits only); polls every millisecond."""
    deadline = time.monotonic() + timeout_s
    while region.counter_total(counter) < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"counter {counter} stuck at {region.read_counter(counter)}, wanted {total}")
        time.sleep(0.001)


class Transfer:
    """One agent's rounds: PUT then GET `total_bytes` in chunks of `chunk_bytes` through its engine.

    As the compute node does, each round's operations are queued as triggered operations first
    (the setup the CPU does once), and one counter store then fires them all: the clock runs from
    that store until the last completion is counted. The region and its compute stand-in are set
    up once; close() (or the `with` block) removes them.
    """

    def __init__(self, agent: Agent, chunk_bytes: int, total_bytes: int):
        self.agent, self.chunk_bytes = agent, chunk_bytes  # the nominal size: the label
        self.kv_bytes = kv_bytes_of(chunk_bytes)          # what a chunk really holds and moves
        self.count = count = max(2, total_bytes // chunk_bytes)
        self.area = area = count * self.kv_bytes
        size = 2 * area + 4096
        self.region = Region.create(f"kvtb-bench-{uuid.uuid4().hex[:8]}", size, size - 4096, 4)
        self.region.array[:area] = np.random.default_rng(0).integers(0, 256, area, dtype=np.uint8)
        self.region.array[area:2 * area] = 0  # touched once, as a KV pool in use is: no first-touch faults timed
        self.reg = agent.register(self.region.name, size, "bench", size - 4096, 4)
        self.put_s: list[float] = []
        self.get_s: list[float] = []
        try:
            self.compute = ComputeStandIn(self.region, size - 4096)
        except BaseException:
            self._release()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fire(self, trigger: int, works: list, done: int, round_number: int) -> float:
        self.agent.queue_triggered(self.reg, [(trigger, round_number, work, done) for work in works])
        return self.compute.fire(trigger, round_number, done, round_number * self.count)

    def round(self, r: int) -> None:
        """Round r (1, 2, ...): PUT every chunk, GET them back into the region's other half, check them."""
        agent, count, area, chunk_bytes = self.agent, self.count, self.area, self.kv_bytes
        refs = [ChunkRef("bench", f"{chunk_bytes}-{r}", i, 0, 0) for i in range(count)]
        puts = [DataWork("put", ref, strided_ranges(0, i, count, chunk_bytes), (0, 0)) for i, ref in enumerate(refs)]
        self.put_s.append(self._fire(PUT_TRIGGER, puts, PUT_DONE, r))
        gets = [DataWork("get", ref, strided_ranges(area, i, count, chunk_bytes), (0, 0)) for i, ref in enumerate(refs)]
        self.get_s.append(self._fire(GET_TRIGGER, gets, GET_DONE, r))
        failed = self.region.read_counter(PUT_DONE)[1] + self.region.read_counter(GET_DONE)[1]
        if failed:
            raise RuntimeError(f"{failed} transfers of {format_bytes(self.chunk_bytes)} chunks failed "
                               f"in round {r}")
        if bytes(self.region.view(area, area)) != bytes(self.region.view(0, area)):
            raise RuntimeError(f"GET of {format_bytes(self.chunk_bytes)} chunks gave other bytes "
                               "than were PUT")
        agent.drop_context("bench", refs[0].context_id)

    def result(self) -> dict:
        area = self.area
        return {"chunk_bytes": self.chunk_bytes, "kv_bytes": self.kv_bytes, "kv_parts": KV_PARTS,
                "chunks": self.count, "ranges_per_chunk": RANGES_PER_CHUNK, "rounds": len(self.put_s),
                "put_bytes_per_s": area / min(self.put_s), "get_bytes_per_s": area / min(self.get_s),
                "rounds_bytes_per_s": {"put": [area / s for s in self.put_s], "get": [area / s for s in self.get_s]}}

    def close(self) -> None:
        self.compute.close()
        self._release()

    def _release(self) -> None:
        self.agent.deregister(self.reg.region_id, "bench")
        self.region.close()


def transfer(agent: Agent, chunk_bytes: int, total_bytes: int, rounds: int,
             before_round: Callable[[], None] = lambda: None) -> dict:
    """`rounds` rounds of one agent's Transfer; before_round() runs before each. The best round counts."""
    return transfers({"": agent}, chunk_bytes, total_bytes, rounds, before_round)[""]


def transfers(agents: dict[str, Agent], chunk_bytes: int, total_bytes: int, rounds: int,
              before_round: Callable[[], None] = lambda: None) -> dict[str, dict]:
    """transfer() for several agents, their rounds taking turns (round r of each, in an order that
    rotates, then r + 1), so that each sees the same moments of a shared machine."""
    with contextlib.ExitStack() as stack:
        runs = {name: stack.enter_context(Transfer(agent, chunk_bytes, total_bytes))
                for name, agent in agents.items()}
        names = list(runs)
        for r in range(1, rounds + 1):
            before_round()
            turn = (r - 1) % len(names)
            for name in names[turn:] + names[:turn]:
                runs[name].round(r)
        return {name: run.result() for name, run in runs.items()}


def direct(fabric_address: str, chunk_bytes: int, total_bytes: int, rounds: int) -> dict:
    """The storage node alone: values of the agent's size, one frame each, stored and retrieved by a
    bare FabricClient (authenticated, its capsules sealed, as the agent's are) that copies and checks
    nothing itself (its Retrieves skip the node's guard check, as the agent's do); the best of `rounds`."""
    count = max(2, total_bytes // chunk_bytes)
    chunk_bytes = kv_bytes_of(chunk_bytes)  # the values the agent stores
    view = memoryview(np.random.default_rng(1).integers(0, 256, count * chunk_bytes, dtype=np.uint8))
    client = bench_client(fabric_address)
    client.connect()
    put_s, get_s = [], []

    def timed(submit: Callable[[], list]) -> float:
        start = time.perf_counter()  # the checksums the client computes are in the time, as a host's are
        for future in submit():
            future.result().raise_for_status()
        return time.perf_counter() - start

    try:
        for r in range(rounds):
            keys = [cf.chunk_key("direct", "bench", str(r), i) for i in range(count)]
            frames = [[view[i * chunk_bytes:(i + 1) * chunk_bytes]] for i in range(count)]
            put_s.append(timed(lambda: [client.submit(pb.CommandCapsule(
                command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1, key=k, value_length=chunk_bytes,
                crc32c=cf.crc32c_of(f), has_crc32c=True), f) for k, f in zip(keys, frames)]))
            get_s.append(timed(lambda: [client.submit(pb.CommandCapsule(
                command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1, key=k,
                skip_guard_check=True)) for k in keys]))
            for k in keys:
                client.delete(1, k)
    finally:
        client.close()
    moved = count * chunk_bytes
    return {"put_bytes_per_s": moved / min(put_s), "get_bytes_per_s": moved / min(get_s)}


def transfer_beside_limits(agents: dict[str, tuple[Agent, str]], chunk_bytes: int, total_bytes: int,
                           rounds: int, budget_s: float, directory: Path) -> dict:
    """transfers() of every security mode's agent with a window of every raw limit before each round
    (on directory's disk, budget_s per limit in all), then the storage node alone (`direct`, the
    secure one), and the ratios. The figures at the top are the default ("secure") path's; the other
    modes' are under "security"; `{op}_{mode}_vs_open` compares each mode with no security."""
    with path_meters(chunk_bytes, directory, total_bytes) as meters:
        sampler = Sampler(meters, budget_s / rounds)
        by_mode = transfers({m: agent for m, (agent, _) in agents.items()}, chunk_bytes, total_bytes,
                            rounds, before_round=sampler)
    t = by_mode.pop("secure")
    t["security"] = by_mode
    open_ = by_mode.get("open")
    for mode, figures in ((m, f) for m, f in [("secure", t), *by_mode.items()] if open_ and m != "open"):
        for op in ("put", "get"):
            t[f"{op}_{mode}_vs_open"] = figures[f"{op}_bytes_per_s"] / open_[f"{op}_bytes_per_s"]
    t["raw_limits_bytes_per_s"] = sampler.best()
    t["storage_node_direct"] = alone = direct(agents["secure"][1], chunk_bytes, total_bytes, rounds)
    for op, limit in put_get_limits(t["raw_limits_bytes_per_s"]).items():
        t[f"{op}_limit_bytes_per_s"] = limit
        t[f"{op}_vs_limit"] = t[f"{op}_bytes_per_s"] / limit
        t[f"{op}_vs_direct"] = t[f"{op}_bytes_per_s"] / alone[f"{op}_bytes_per_s"]
    return t


def security_ratios(rows: list[dict]) -> dict[str, float]:
    """Per chunk size `{op}_{mode}_vs_open_{size}`, and at SECURITY_BYTES also without the size."""
    ratios = {}
    for t in rows:
        size = format_bytes(t["chunk_bytes"]).replace(" ", "").replace("i", "").lower()
        for key in (k for k in t if k.endswith("_vs_open")):
            ratios[f"{key}_{size}"] = t[key]
            if t["chunk_bytes"] == SECURITY_BYTES:
                ratios[key] = t[key]
    return ratios


SECURITY_FLOORS = {"put_secure_vs_open": SECURITY_FLOOR, "get_secure_vs_open": SECURITY_FLOOR}


def transfers_table(transfers: list[dict]) -> str:
    """Per chunk size: the path, the node alone and the raw limit in MB/s, with each op's ratio, and
    every round's spread (the best alone hides how far the rounds spread on a shared machine)."""
    rows, spreads = [], []
    for t in transfers:
        alone = t["storage_node_direct"]
        rows.append([format_bytes(t["chunk_bytes"]), *(
            cell for op in ("put", "get") for cell in (
                *(f"{v / 1e6:.0f}" for v in (t[f"{op}_bytes_per_s"], alone[f"{op}_bytes_per_s"],
                                             t[f"{op}_limit_bytes_per_s"])), f"{t[f'{op}_vs_limit']:.2f}"))])
        spreads.append(rounds_line(t))
        if "security" in t:
            spreads.append(security_line(t))
    head = ["chunk", "PUT MB/s", "node alone", "raw limit", "PUT/limit",
            "GET MB/s", "node alone", "raw limit", "GET/limit"]
    return "\n".join([format_table(head, rows), *spreads])


def security_line(t: dict) -> str:
    """One size's path in every security mode, MB/s (best round), with mode / open in brackets."""
    def op(name: str) -> str:
        modes = [("secure", t), *t["security"].items()]
        return ", ".join(f"{mode} {f[f'{name}_bytes_per_s'] / 1e6:.0f}" + (
            f" ({t[f'{name}_{mode}_vs_open']:.2f})" if f"{name}_{mode}_vs_open" in t else "") for mode, f in modes)

    return f"{format_bytes(t['chunk_bytes'])} by security, MB/s (vs open): PUT {op('put')}; GET {op('get')}"


def rounds_line(t: dict) -> str:
    """Every round's rate of one size: worst, median and best."""
    def spread(rates: list[float]) -> str:
        return " / ".join(f"{v / 1e6:.0f}" for v in (min(rates), float(np.median(rates)), max(rates)))

    rounds = t["rounds_bytes_per_s"]
    return (f"{format_bytes(t['chunk_bytes'])} rounds, MB/s worst / median / best: "
            f"PUT {spread(rounds['put'])}, GET {spread(rounds['get'])}")


def context_line(c: dict) -> str:
    """The whole context's restore: its rate and the ZeroMQ limit beside it, every round's spread."""
    rounds = " / ".join(f"{v / 1e6:.0f}" for v in sorted(c["rounds_bytes_per_s"]))
    return (f"context of {c['tokens']} tokens ({c['blocks']} blocks, {c['bytes'] / 1e6:.1f} MB) restored by bulk GET "
            f"in {c['layer_groups']} layer groups: {c['bytes_per_s'] / 1e6:.0f} MB/s (rounds {rounds}), ZeroMQ "
            f"loopback {c['zmq_tcp_bytes_per_s'] / 1e6:.0f} MB/s ({c['zmq_message_bytes'] >> 10} KiB messages): "
            f"{c['vs_zmq']:.2f}")


def transfers_by_size(result: dict, agents, sizes: list[int], total_bytes: int, rounds: int, budget_s: float,
                      directory: Path, progress) -> list[dict]:
    """transfer_beside_limits() of each chunk size; a size that raises is recorded in
    result["failed"] (part "<size> chunks") and the others still run."""
    rows = []
    for size in sizes:
        try:
            rows.append(transfer_beside_limits(agents, size, total_bytes, rounds, budget_s, directory))
        except Exception as exc:  # noqa: BLE001 - a failed size is reported with its error
            fail(result, f"{format_bytes(size)} chunks", exc)
        progress.update(note=format_bytes(size))
    return rows


def chunks_line(result: dict) -> str:
    """How the chunks were stored: the format version and the MACed parts per chunk."""
    s = result["settings"]
    return (f"chunks in format v{s.get('chunk_format_version', '?')}, {s.get('kv_parts', 1)} KV parts "
            f"(a MAC each, as a block of the real model's layers), gathered from "
            f"{s.get('ranges_per_chunk')} ranges")


def table(result: dict) -> str:
    failed = failed_text(result)
    r = result["results"]
    by = r.get("by_placement") or {"shared": {"trigger_to_fire": r["trigger_to_fire"],
                                              "context_restore": r["context_restore"], "layout": {}}}
    placements = "\n".join(
        f"[{name}: " + ", ".join(f"{k} {v}" for k, v in m["layout"].items()) + f"]\n{trigger.text(m['trigger_to_fire'])}"
        + (f"\n{context_line(m['context_restore'])}" if m["context_restore"] else "") for name, m in by.items())
    return (f"{placements}\n"
            f"{chunks_line(result)}\n{transfers_table(r['transfers'])}\n\n{ratios_text(result['ratios'])}"
            + (f"\n\n{failed}" if failed else ""))


def run(args: argparse.Namespace) -> dict:
    keep_large_buffers_in_the_heap()  # the agent runs in this process: as its main sets it up, first
    result = new_result("smartnic", {"sizes_mib": args.sizes_mib, "total_mib": args.total_mib,
                                     "rounds": args.rounds, "trigger_samples": args.trigger_samples,
                                     "budget_s": args.budget_s, **chunk_format_settings(),
                                     "context_tokens": args.context_tokens, "context_rounds": args.context_rounds,
                                     "fsync": True, "smoke": args.smoke})
    by_placement: dict[str, dict] = {}
    with progress_for(args, len(args.placements) + len(args.sizes_mib), "smartnic") as progress, \
            data_dir(args, "smartnic") as path:
        for name in args.placements:
            for ring in args.fire_ring:
                variant = name if ring == "off" else f"{name}+ring"
                try:
                    by_placement[variant] = measure_placement(args, path / variant, name, ring == "on")
                except Exception as exc:  # noqa: BLE001 - a placement that fails is reported, the others still run
                    fail(result, f"placement {variant}", exc)
            progress.update(note=name)
        with agents_beside_storage(path, max(512, args.trigger_samples)) as agents:
            rows = transfers_by_size(result, agents, [mib << 20 for mib in args.sizes_mib], args.total_mib << 20,
                                     args.rounds, args.budget_s, path, progress)
    for name in args.placements:  # the ring against none, in this run
        off, on = by_placement.get(name), by_placement.get(f"{name}+ring")
        if off and on:
            figures_off, figures_on = trigger.figures(off["trigger_to_fire"]), trigger.figures(on["trigger_to_fire"])
            for figure, value in figures_on.items():
                result["ratios"][f"{figure}@{name}_ring_vs_off"] = round(value / max(figures_off[figure], 1e-9), 3)
    first = by_placement.get("shared") or next(iter(by_placement.values()), None)
    if first is None:
        raise RuntimeError("no placement could be measured: " + failed_text(result))
    fire, context = first["trigger_to_fire"], first["context_restore"]
    result["results"] = {"trigger_to_fire": fire, "context_restore": context, "transfers": rows,
                         "by_placement": by_placement}
    result["machine"]["placements"] = {name: m["layout"] for name, m in by_placement.items()}
    result["ratios"]["context_restore_vs_zmq"] = context["vs_zmq"]
    for name, m in by_placement.items():
        if m["context_restore"]:
            result["ratios"][f"context_restore_vs_zmq@{name}"] = m["context_restore"]["vs_zmq"]
        for figure, value in trigger.figures(m["trigger_to_fire"]).items():
            result["ratios"][f"{figure}@{name}"] = value
    if "shared" in by_placement and "nic" in by_placement:
        result["ratios"]["trigger_to_fire_idle_p99_nic_vs_shared"] = (
            by_placement["nic"]["trigger_to_fire"]["idle"]["p99_us"]
            / max(by_placement["shared"]["trigger_to_fire"]["idle"]["p99_us"], 1e-9))
    if (watcher := trigger.cpu_ratio(fire)) is not None:
        result["ratios"]["watcher_cpu_python_vs_compiled"] = watcher
    for op in ("put", "get"):  # the worst over the sizes measured (a failed size is in `failed`)
        if rows:
            result["ratios"][f"{op}_vs_limit"] = min(t[f"{op}_vs_limit"] for t in rows)
            result["ratios"][f"{op}_vs_storage_node_alone"] = min(t[f"{op}_vs_direct"] for t in rows)
    result["ratios"] |= security_ratios(rows)
    result["floors"] = floors(result["ratios"], {"put_vs_limit": FLOOR, "context_restore_vs_zmq": RESTORE_FLOOR,
                                                 **SECURITY_FLOORS})
    result["floors"] |= floors(trigger.figures(fire), {}, at_most=trigger.TRIGGER_CEILINGS)
    for name in ("nic", OWN_CORE, "nic+ring", f"{OWN_CORE}+ring"):  # the targets for the NIC's own cores
        if name in by_placement:
            result["floors"] |= floors(result["ratios"], {f"context_restore_vs_zmq@{name}": NIC_RESTORE_FLOOR},
                                       at_most={f"{figure}@{name}": NIC_TRIGGER_CEILINGS[figure.split("_")[-2]]
                                                for figure in trigger.figures(by_placement[name]["trigger_to_fire"])})
    return result


def measure_placement(args: argparse.Namespace, directory: Path, name: str, ring: bool = False) -> dict:
    """Trigger-to-fire and the whole context's restore with the agent, its storage node and the stand-in
    compute node where placement `name` puts them (bench.nic_layouts); the context only where the
    layout is one a deployment uses (not the own-core what-if). ring: the agent's watcher_fire_ring."""
    layout = layout_of(name)
    settings = {**layout.settings, "watcher_fire_ring": ring}
    directory.mkdir(parents=True, exist_ok=True)
    with pinned(layout), agent_beside_storage(directory, max(512, args.trigger_samples), "secure", settings,
                                              layout.storage) as (agent, _):
        fire = trigger.measure(agent, args.trigger_samples, compute_cpus=layout.compute)
        context = None if name == OWN_CORE else context_restore(agent, args.context_tokens, args.context_rounds,
                                                                 args.budget_s)
    return {"layout": layout.record(), "settings": settings, "trigger_to_fire": fire,
            "context_restore": context}


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
