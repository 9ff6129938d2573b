"""`kvtb bench landing`: a restore's landing, C against Python, side by side: bytes a second and the GIL it holds.

A restored context's blocks (SmolLM2-135M's shape: 30 layers, one KV part each) arrive as the agent's
data path receives them: per layer group one range per block, cut into data PDUs of 2 MiB that span
blocks. Each block lands through smartnic.landing.Landing (the header and token ids checked, the MACs
checked) into a region-sized buffer, with the compiled landing (hostmem/_lander.c: a block's KV copied
and MAC-fed in one C call without the GIL) and with Python's (hostmem.dma's numpy engine: part by part),
in alternating rounds. Two figures for each: MB/s of stored value landed (the best round), and how late a
second Python thread wakes while the landing goes on (it sleeps 200 µs at a time; p50 and p99 of how much
later than that it got the GIL back, over every round): the agent's other threads (its gRPC and fabric
I/O, the watcher's hand-offs) wait that long behind a landing that holds the GIL.

Then what a page fault costs a landing: the context's bytes copied (the copy engine, no MAC) into a
region attached the way the agent attaches a pool, whose pages (a) nobody used yet, (b) the creating
process wrote (a compute node's used pool), or (c) were mapped up front (Region.populate, as the
compute node and the agent now do), each region fresh; GB/s of each first copy. In-process: no sockets,
so this is the landing alone (`kvtb bench smartnic` and `kvtb bench ttft` measure it in the services).
"""
from __future__ import annotations

import argparse
import logging
import threading
import time

import numpy as np

from bench.results import add_common_args, finish, format_table, new_result, setup_logging
from bench.stats import percentile
from fabric import chunk_format as cf
from hostmem import dma, gather
from hostmem import kv_dtype as kvd
from kvtb.crc32c import crc32c
from smartnic.datapath import GET_PDU_BYTES, _Bulk, stored_block
from smartnic.landing import Landing

logger = logging.getLogger(__name__)

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64  # SmolLM2-135M
MAC_KEY, KEY, GENERATION = bytes(range(32)), b"k" * 16, 7


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench landing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048, help="context tokens restored (default 2048)")
    parser.add_argument("--block-tokens", type=int, default=32)
    parser.add_argument("--layer-groups", type=int, default=4, help="ranges per block (compute.layer_groups)")
    parser.add_argument("--kv-dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(kvd.KV_DTYPES))
    parser.add_argument("--rounds", type=int, default=5)
    add_common_args(parser, "landing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.rounds = 4 * args.block_tokens, 2
    if args.tokens < args.block_tokens or args.rounds < 1 or not 1 <= args.layer_groups <= LAYERS:
        parser.error("--tokens must hold a block, --rounds be at least 1, --layer-groups 1-30")
    return args


class Context:
    """The stored values of a context's blocks and the region they land in."""

    def __init__(self, tokens: int, block_tokens: int, kv_dtype: str, layer_groups: int):
        self.blocks = tokens // block_tokens
        part = block_tokens * KV_HEADS * HEAD_DIM * 2 * kvd.size(kv_dtype)  # K and V of one layer
        rng = np.random.default_rng(1)
        ids = np.arange(block_tokens, dtype=np.uint32).tobytes()
        self.values, self.chunks, self.targets = [], [], []
        stride = len(ids) + LAYERS * part + 4096
        self.mem = np.zeros(self.blocks * stride, np.uint8)
        self.mem[:] = 1  # touched: page faults are not the landing's
        for b in range(self.blocks):
            kv = rng.integers(0, 256, LAYERS * part, dtype=np.uint8).tobytes()
            header = cf.ChunkHeader("u", "ctx", b, b * block_tokens, (b + 1) * block_tokens, len(kv), b"n" * 16,
                                    GENERATION, cf.MAC_BYTES, "acme", b"p" * 16, kv_parts=LAYERS,
                                    kv_dtype=kv_dtype)
            value = b"".join(bytes(x) for x in cf.sealed(MAC_KEY, KEY, header, [ids], [kv]))
            self.values.append(value)
            self.chunks.append(stored_block(header, "s0", KEY, len(value), crc32c(value),
                                            len(cf.encode_header(header))))
            self.targets.append(gather.runs_of([(b * stride, len(ids)), (b * stride + 4096, len(kv))]))
        self.groups = [(g * LAYERS // layer_groups, (g + 1) * LAYERS // layer_groups) for g in range(layer_groups)]
        ranges = [Landing(c, self.mem, t, MAC_KEY, self.groups, lambda g, err: None).range
                  for c, t in zip(self.chunks, self.targets)]
        self.streams = [b"".join(memoryview(v)[o:o + n] for v, r in zip(self.values, ranges) for o, n in [r(g)])
                        for g in range(layer_groups)]
        self.kv_dtype = kv_dtype
        self.bytes = sum(len(v) for v in self.values)

    def land(self, engine: str) -> None:
        """Every block's ranges, group by group, each group as one range command's data PDUs of GET_PDU_BYTES
        across the blocks, split among them by the data path's own _Bulk; raises unless every block landed
        and checked out."""
        landings = [Landing(c, self.mem, t, MAC_KEY, self.groups, lambda g, err: None, kv_dtype=self.kv_dtype,
                            engine=engine) for c, t in zip(self.chunks, self.targets)]
        for group in range(len(self.groups)):
            bulk = _Bulk(group, landings)
            stream = memoryview(self.streams[group])  # the group's ranges back to back, as the node sends them
            for offset in range(0, stream.nbytes, GET_PDU_BYTES):
                bulk.take(offset, [stream[offset:offset + GET_PDU_BYTES]])
            for a in landings:
                a.end_range(group)
        failed = [a.error for a in landings if a.error is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} blocks failed to land: {failed[0].kind}: {failed[0]}")


def probed(work, nap_s: float = 200e-6) -> list[float]:
    """work(), while a second thread sleeps nap_s at a time: how much later than nap_s each of its
    wake-ups got the GIL back (seconds)."""
    stop, late = threading.Event(), []

    def probe() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            time.sleep(nap_s)
            late.append(time.perf_counter() - start - nap_s)

    t = threading.Thread(target=probe)
    t.start()
    try:
        work()
    finally:
        stop.set()
        t.join()
    return late


def first_copies(nbytes: int) -> dict[str, float]:
    """GB/s of a first copy of nbytes into an attached region whose pages are unused, used by their creator,
    or mapped up front (a fresh region each)."""
    import uuid

    from hostmem.region import Region
    src = np.random.default_rng(2).integers(0, 256, nbytes, dtype=np.uint8)
    size = nbytes + 4096  # and a page of counters
    out = {}
    for case in ("unused", "used_by_creator", "populated"):
        name = f"kvtb-bench-landing-{uuid.uuid4().hex[:8]}"
        creator = Region.create(name, size, nbytes, 1)
        try:
            if case == "used_by_creator":
                creator.array[:nbytes] = 0
            attached = Region.attach(name, size, nbytes, 1)
            try:
                if case == "populated" and not (creator.populate() and attached.populate()):
                    continue  # not available here: no figure
                start = time.perf_counter()
                dma.scatter(src, attached.array, [gather.Run(0, nbytes, nbytes, 1)], None)
                out[case] = nbytes / (time.perf_counter() - start) / 1e9
            finally:
                attached.close()
        finally:
            creator.close()
    return out


def measure(args: argparse.Namespace) -> tuple[list[dict], dict[str, float]]:
    engines = ["numpy"] + (["compiled"] if dma.ENGINE == "compiled" and dma._lander is not None else [])
    rows, ratios = [], {}
    for dtype in args.kv_dtypes:
        context = Context(args.tokens, args.block_tokens, dtype, args.layer_groups)
        best = {e: float("inf") for e in engines}
        late = {e: [] for e in engines}
        for _ in range(args.rounds):
            for engine in engines:  # side by side, alternating
                start = time.perf_counter()
                context.land(engine)
                best[engine] = min(best[engine], time.perf_counter() - start)
                late[engine] += probed(lambda: context.land(engine))
        for engine, wall in best.items():
            rows.append({"kv_dtype": dtype, "engine": engine, "blocks": context.blocks, "mb": context.bytes / 1e6,
                         "ms": wall * 1e3, "mb_per_s": context.bytes / wall / 1e6,
                         "wake_late_us": {"p50": percentile(late[engine], 50) * 1e6,
                                          "p99": percentile(late[engine], 99) * 1e6, "n": len(late[engine])}})
        if "compiled" in best:
            ratios[f"compiled_vs_python_speed_{dtype}"] = round(best["numpy"] / best["compiled"], 3)
            ratios[f"wake_late_p99_python_vs_compiled_{dtype}"] = round(
                percentile(late["numpy"], 99) / max(percentile(late["compiled"], 99), 1e-9), 3)
    return rows, ratios


def render(result: dict) -> str:
    s = result["settings"]
    rows = [[r["kv_dtype"], "C (hostmem/_lander.c)" if r["engine"] == "compiled" else "Python", r["blocks"],
             f"{r['mb']:.1f}", f"{r['ms']:.1f}", f"{r['mb_per_s']:.0f}", f"{r['wake_late_us']['p50']:.0f}",
             f"{r['wake_late_us']['p99']:.0f}"]
            for r in result["results"]["rows"]]
    return (f"a {s['tokens']}-token context in blocks of {s['block_tokens']} tokens, {s['layer_groups']} layer "
            f"groups, PDUs of {GET_PDU_BYTES >> 20} MiB, MACs checked; best of {s['rounds']} rounds each\n"
            + format_table(["kv dtype", "landing", "blocks", "MB", "ms", "MB/s", "wake late p50 µs",
                           "p99 µs"], rows)
            + ("" if any(r["engine"] == "compiled" for r in result["results"]["rows"])
               else "\nthe compiled landing was not built: Python only")
            + "\nfirst copy of the context into an attached region, GB/s: "
            + ", ".join(f"{case.replace('_', ' ')} {v:.2f}" for case, v in result["results"]["first_copy_gb_per_s"].items()))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging(args)
    rows, ratios = measure(args)
    copies = first_copies(args.tokens * LAYERS * KV_HEADS * HEAD_DIM * 2 * kvd.size("float32"))  # the fp32 KV
    for case in ("unused", "used_by_creator"):
        if case in copies and "populated" in copies:
            ratios[f"first_copy_populated_vs_{case}"] = round(copies["populated"] / copies[case], 3)
    result = new_result("landing", {"tokens": args.tokens, "block_tokens": args.block_tokens,
                                    "layer_groups": args.layer_groups, "kv_dtypes": args.kv_dtypes,
                                    "rounds": args.rounds})
    result["results"] = {"rows": rows, "first_copy_gb_per_s": copies}
    result["ratios"] = ratios
    finish(args, result, render(result))
    return 0
