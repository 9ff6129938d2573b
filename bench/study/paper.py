"""`kvtb study paper`: the triggered-operations paper's Figs. 5-7 and Fig. 2, measured on the testbed.

Figs. 5-7 (Dhakal et al., Section V-B): the time to move a KV cache from accelerator memory to a
remote storage node, CPU-centric against triggered, by KV size, and the speedup by size. Here both
paths are the product's own code, run on one registered KV pool against one storage node process
(fabric authentication, sealed capsules, a MAC per layer, every store durable before its ack):

- CPU-centric (policy `cpu`): a compute process copies each block out of the pool, seals it and
  stores it through its own fabric client, waiting for the acknowledgement before the next block
  (compute_node.cpu_offload.CpuOffload, as the engine thread runs it).
- triggered (the paper's design): the same compute process only writes each block's descriptor and
  stores its PUT trigger counter (compute_node.offload.TriggeredOffload); the agent's standing
  triggered PUT (an in-process smartnic.agent.Agent, as `kvtb bench smartnic` runs it) gathers,
  seals and stores the block and bumps its PUT-done counter.
- CPU-centric, pipelined (`cpu-pipelined`): the CPU-centric path with as many blocks' stores in flight
  as the triggered path keeps (the agent's fabric queue depth), waiting for all of them at the end: it
  separates what pipelining alone gives from what offload gives.

For each size every path is timed in the compute process: end to end (from the first block handed over
until the last block is acknowledged as stored), and the time the compute process is blocked
(CPU-centric: all of it; triggered: the descriptor writes and counter stores) and busy (its CPU
time meanwhile, every thread's). Every path is warmed up first at every size (connect and
DH-HMAC-CHAP land in no sample) and they take turns in an order that rotates across repetitions;
every stored key is deleted between samples. The medians are set beside `kvtb simulate` (the
paper's analytical model, as we read Tables II and III) and the same model calibrated to this run's
samples (bench.calibration), extrapolated to 5 TiB as the paper's Fig. 6 is.

Fig. 2: the eight steps of a turn on one time axis (bench/study/paper_turn.py). The claims are a table
(bench/study/paper_claims.py), judged per repetition by bench.study.claims.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import time
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import analytical_model as am
from bench.progress import Progress
from bench.results import format_bytes, format_seconds, services_dir
from bench.study import paper_claims, paper_plots, paper_rig
from bench.study.child_process import ChildProcess
from bench.study.paper_figures import (MODES, calibration_transfers, markdown_table, model_part, summarize,
                                       transfer_ratios)
from bench.study.paper_turn import cached_tiny_model  # noqa: F401 - bench.study.poster's smoke model
from bench.study.paper_turn import follow_up_figures, measure_turn, plot_gantt
from bench.study.report import add_study_args, check_profile, judge, main_of, new_study, run_part

try:  # the separating experiments (compute freed as compute, the GET direction): another part's module
    from bench.study import paper_causes
except ImportError:  # not built yet: the study runs without them
    paper_causes = None

logger = logging.getLogger(__name__)

KIB, MIB, GIB, TIB = am.KIB, am.MIB, am.GIB, am.TIB

# The pool's shape: SmolLM2-135M's (fp32, head_dim 64), with 32 layers and 2 KV heads instead of 30
# and 3, so that one token's KV is exactly 32 KiB and the paper's sizes are whole tokens.
NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, DTYPE_BYTES = 32, 2, 64, 4
TOKEN_KV_BYTES = NUM_LAYERS * 2 * NUM_KV_HEADS * HEAD_DIM * DTYPE_BYTES  # 32 KiB
BLOCK_TOKENS = 32  # the study's block: 1 MiB of its 32 KiB tokens, the unit one triggered PUT stores
LADDER = tuple(32 * KIB * 4 ** k for k in range(10))  # 32 KiB, 128 KiB, ... 8 GiB: x4 steps
MAX_BYTES = 2 * GIB        # the largest size measured, at most
QUICK_MAX_BYTES = 512 * MIB
SMOKE_SIZES = (32 * KIB, 512 * KIB, 2 * MIB)
REPEATS = {"full": 7, "quick": 5, "smoke": 2}
MEMORY_SHARE = 8           # the largest size is at most MemAvailable / 8 (and free disk / 8)
NSID = 1
SALT = "kvtb-study-paper-salt"
TENANT, KEY = "default", "paper"
TOKEN_ID_SPACE = 49152  # SmolLM2's vocabulary


# -- sizes (pure) ------------------------------------------------------------------------------------

def layout_for_size(size: int):
    """The pool layout holding exactly `size` bytes of KV: blocks of BLOCK_TOKENS tokens (1 MiB), or one
    smaller block for a size under a block. ValueError unless size is a whole number of tokens that
    fills whole blocks."""
    from hostmem.kv_layout import KvLayout

    tokens, rest = divmod(size, TOKEN_KV_BYTES)
    if size <= 0 or rest:
        raise ValueError(f"a KV size must be a positive multiple of {TOKEN_KV_BYTES} bytes (one token), "
                         f"got {size}")
    block_tokens = min(BLOCK_TOKENS, tokens)
    if tokens % block_tokens:
        raise ValueError(f"{tokens} tokens do not fill whole blocks of {block_tokens}")
    return KvLayout(num_blocks=tokens // block_tokens, num_layers=NUM_LAYERS, num_kv_heads=NUM_KV_HEADS,
                    block_tokens=block_tokens, head_dim=HEAD_DIM, dtype_bytes=DTYPE_BYTES)


def largest_size(memory_available: int | None, disk_free: int | None, cap: int = MAX_BYTES) -> int:
    """The largest size of the ladder that is at most cap, MemAvailable / MEMORY_SHARE and free disk /
    MEMORY_SHARE (the pool in shared memory, the storage node's page cache and file, and room for both
    to stay clear of reclaim); 32 KiB at least."""
    known = [v // MEMORY_SHARE for v in (memory_available, disk_free) if v]
    bound = min([cap, *known])
    fitting = [s for s in LADDER if s <= bound]
    return fitting[-1] if fitting else LADDER[0]


def ladder_to(largest: int) -> list[int]:
    """32 KiB, x4 ... up to largest."""
    return [s for s in LADDER if s <= largest]


def memory_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def triggered_in_flight() -> int:
    """The blocks the triggered path keeps in flight: the agent's fabric queue depth per storage node
    (SmartNicSettings.queue_depth; the rig has one node), which the pipelined CPU-centric path matches."""
    from smartnic.settings import SmartNicSettings

    return SmartNicSettings.__dataclass_fields__["queue_depth"].default


# -- the compute process: every path, timed where the compute node runs them --------------------------

def _compute_main(conn, fabric_address: str, host_nqn: str) -> None:
    """Child process: the compute node's side of every path over a pool the parent registered."""
    import numpy as np

    from compute_node.cpu_offload import CpuOffload, CpuStore
    from compute_node.kv_pool import KvPool
    from compute_node.offload import Block, OffloadStats, TriggeredOffload
    from fabric.auth import FabricSecurity
    from hostmem.block_hash import hash_chain, salt_for
    from hostmem.kv_layout import KvLayout
    from hostmem.region import Region
    from kvtb.credentials import Credentials, resolve_dir
    from scale import settings as scale_settings

    _, pacer = scale_settings.from_environment()  # under a hardware profile (`kvtb study paper --profile`)
    mac_key = Credentials(resolve_dir(""), "compute").kv_mac_key()
    store = CpuStore((fabric_address,), host_nqn, NSID, SALT, timeout_s=30.0 * (pacer.dilation if pacer else 1),
                     security=FabricSecurity.for_host("auth", "", host_nqn), mac_key=mac_key)
    pool = trig = cpu = piped = None

    def run(mode: str, user: str, context: str) -> dict:
        L = pool.layout
        n, bt = L.num_blocks, L.block_tokens
        ids = (np.arange(n * bt, dtype=np.int64) % TOKEN_ID_SPACE).astype("<u4")
        pool.token_ids[:] = ids.reshape(n, bt)  # what the model wrote: untimed, the same for both paths
        names = hash_chain(ids.tolist(), salt_for(TENANT, user), bt)
        blocks = [Block(b, b, bt, names[b], names[b - 1] if b else b"", TENANT, user, context)
                  for b in range(n)]
        stats = OffloadStats()
        step = L.counters_per_block
        done = pool.counters[1:n * step:step]  # [block, success|error]: the blocks' PUT-done counters
        base_total, base_errors = int(done.sum()), int(done[:, 1].sum())
        # CPU time of the whole process: the fabric client's I/O thread too
        start, cpu0 = time.perf_counter(), time.process_time()
        if mode == "triggered":
            for block in blocks:
                trig.store(block, stats)
            issued, cpu1 = time.perf_counter(), time.process_time()
            deadline = issued + 300.0 * (pacer.dilation if pacer else 1)
            while int(done.sum()) < base_total + n:  # the agent's PUT-done counters: every block stored
                if time.perf_counter() > deadline:
                    left = base_total + n - int(done.sum())
                    raise TimeoutError(f"{left} of {n} triggered PUTs did not end")
                time.sleep(0.00002)
            end = time.perf_counter()
            failed = int(done[:, 1].sum()) - base_errors
            keys: list[bytes] = []
        elif mode in ("cpu", "cpu-pipelined"):
            path = cpu if mode == "cpu" else piped
            if path is None:
                raise ValueError(f"mode {mode!r}: CpuOffload takes no in_flight here")
            errors = path.errors
            for block in blocks:
                path.store(block, stats)
            issued = time.perf_counter()  # pipelined: the last block handed over, K stores outstanding
            if mode == "cpu-pipelined":
                path.drain()
            end, cpu1 = time.perf_counter(), time.process_time()
            failed = path.errors - errors
            keys = [store.index[name].key for name in names if name in store.index]
        else:
            raise ValueError(f"mode {mode!r}")
        if failed:
            why = f" (last: {path.last_error})" if mode != "triggered" and path.last_error else ""
            raise RuntimeError(f"{failed} of {n} {mode} stores failed{why}")
        for key in keys:  # untimed: the next sample finds an empty namespace
            store.client(fabric_address).delete(NSID, key)
        store.index.clear()
        return {"mode": mode, "bytes": n * L.block_bytes, "blocks": n, "block_bytes": L.block_bytes,
                "e2e_s": end - start, "blocked_s": issued - start, "busy_s": cpu1 - cpu0, "t0": start,
                "chunks": stats.chunks, "user": user, "context": context}

    try:
        store.client(fabric_address)  # connect and authenticate now: no sample pays the handshake
        conn.send(("ok", None))
        while (message := conn.recv()) is not None:
            try:
                kind = message[0]
                if kind == "attach":
                    name, fields = message[1], message[2]
                    in_flight = message[3] if len(message) > 3 else 0
                    L = KvLayout(**fields)
                    pool = KvPool(L, Region.attach(name, L.region_bytes, L.counter_offset, L.counter_count))
                    trig, cpu = TriggeredOffload(pool, drain_timeout_s=300.0), CpuOffload(pool, store)
                    piped = _pipelined(CpuOffload, pool, store, in_flight)
                    value = {"modes": [m for m, p in zip(MODES, (cpu, trig, piped)) if p is not None]}
                elif kind == "detach":
                    trig = cpu = piped = None
                    pool.close()
                    pool, value = None, None
                elif kind == "run":
                    value = run(*message[1:])
                elif kind == "pacing":  # the pacer's snapshot (None in real time), then a fresh count
                    value = pacer.snapshot() if pacer else None
                    if pacer and message[1:] == (True,):
                        pacer.reset()
                else:
                    raise ValueError(f"unknown message {kind!r}")
                conn.send(("ok", value))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
    except EOFError:
        pass
    finally:
        store.close()
        if pool is not None:
            pool.close()


def _pipelined(cls, pool, store, in_flight: int):
    """CpuOffload keeping `in_flight` stores outstanding (drain() waits for them), or None when in_flight is
    0 or this CpuOffload takes no in_flight (that part of compute_node.cpu_offload is not built yet)."""
    if in_flight < 1:
        return None
    try:
        piped = cls(pool, store, in_flight=in_flight)
    except TypeError:
        logger.warning("compute_node.cpu_offload.CpuOffload takes no in_flight: no cpu-pipelined path")
        return None
    return piped if callable(getattr(piped, "drain", None)) else None


class ComputeProcess(ChildProcess):
    """The compute process of the transfer measurements (a spawned child, as the compute node is one)."""

    def __init__(self, fabric_address: str, host_nqn: str, timeout_s: float = 120.0):
        super().__init__(_compute_main, (fabric_address, host_nqn), "kvtb-study-compute", timeout_s)


def _fill(region, nbytes: int, seed: int = 5) -> None:
    """Random KV bytes (generated once per 16 MiB, repeated), touched as a pool in use is."""
    import numpy as np

    piece = np.random.default_rng(seed).integers(0, 256, min(nbytes, 16 * MIB), dtype=np.uint8)
    for offset in range(0, nbytes, len(piece)):
        n = min(len(piece), nbytes - offset)
        region.array[offset:offset + n] = piece[:n]


def transfer_rig(directory: Path, **agent_settings: Any) -> contextlib.AbstractContextManager[paper_rig.Rig]:
    """The transfers' rig (bench.study.paper_rig): storage node "paper", this module's compute process."""
    return paper_rig.rig(directory, ComputeProcess, "paper", salt=SALT, **agent_settings)


def _sample(rig, mode: str, size: int, rep: int, tag: str) -> dict:
    agent, storage, admin, compute = rig
    user, context = f"paper-{tag}-{mode}-{rep}", f"ctx-{uuid.uuid4().hex[:8]}"
    cpu0, storage0 = paper_rig.rusage_s(), storage.cpu_seconds()
    out = compute.call(("run", mode, user, context))
    agent_cpu, storage1 = paper_rig.rusage_s() - cpu0, storage.cpu_seconds()
    if mode == "triggered":
        agent.drop_context(user, context)
    paper_rig.wait_empty(admin, NSID)
    out.update(rep=rep, agent_cpu_s=agent_cpu,
               storage_cpu_s=(storage1 - storage0) if storage0 is not None and storage1 is not None else None)
    return out


def rotation(modes: Sequence[str], k: int) -> list[str]:
    """The paths' order in repetition k: rotated by one each time, so each takes each position in turn."""
    k %= len(modes)
    return [*modes[k:], *modes[:k]]


def measure_size(rig, size: int, repeats: int, progress: Progress, first_mode: int = 0,
                 in_flight: int = 0) -> list[dict]:
    """One size: a warm-up of each path the compute process has (kept out of the samples), then `repeats`
    samples of each, the order rotating across repetitions. `in_flight`: the pipelined CPU-centric
    path's blocks in flight (0: not run)."""
    from hostmem.layout_proto import layout_to_proto
    from hostmem.region import Region

    agent, _, _, compute = rig
    L = layout_for_size(size)
    region = Region.create(f"kvtb-paper-{uuid.uuid4().hex[:8]}", L.region_bytes, L.counter_offset,
                           L.counter_count)
    samples: list[dict] = []
    try:
        _fill(region, L.num_blocks * L.block_bytes)
        reg = agent.register(region.name, L.region_bytes, KEY, L.counter_offset, L.counter_count,
                             layout_to_proto(L), owner="bench")
        try:
            got = compute.call(("attach", region.name, dataclasses.asdict(L), in_flight))
            try:
                modes = [m for m in MODES if m in got["modes"]]
                tag = uuid.uuid4().hex[:6]
                for mode in modes:
                    _sample(rig, mode, size, -1, tag)  # warm-up
                progress.update(note=f"{format_bytes(size)} warm-up")
                for rep in range(repeats):
                    for position, mode in enumerate(rotation(modes, rep + first_mode)):
                        samples.append(_sample(rig, mode, size, rep, tag) | {"position": position})
                    progress.update(note=format_bytes(size))
            finally:
                compute.call(("detach",))
        finally:
            agent.deregister(reg.region_id, KEY)
    finally:
        region.close()
    return samples


def measure_transfers(study: dict, sizes: Sequence[int], repeats: int, directory: Path,
                      progress: Progress) -> dict:
    """Every size (one failed size is recorded and the others go on): the samples, the paths measured and
    the pipelined path's blocks in flight."""
    samples: list[dict] = []
    in_flight = triggered_in_flight()
    with transfer_rig(directory) as rig:
        for i, size in enumerate(sizes):
            got = run_part(study, f"transfer {format_bytes(size)}",
                           lambda s=size, i=i: measure_size(rig, s, repeats, progress, i, in_flight))
            samples.extend(got or [])
            if got is None:
                progress.update(repeats + 1, note=f"{format_bytes(size)} failed")
    if not samples:
        raise RuntimeError("no size was measured")
    return {"samples": samples, "modes": [m for m in MODES if any(s["mode"] == m for s in samples)],
            "in_flight": in_flight}


# -- the headline (pure) ---------------------------------------------------------------------------

def _span(low: int, high: int) -> str:
    return format_bytes(low) if low == high else f"{format_bytes(low)}-{format_bytes(high)}"


def headline_rows(study: dict) -> list[dict]:
    """Rows of the README's headline table: {question, measured, target}."""
    r, res = study.get("ratios", {}), study.get("results", {})
    rows = res.get("transfers", {}).get("rows") or []
    failed = {f["part"]: f["error"] for f in study.get("failed", [])}
    span = _span(rows[0]["bytes"], rows[-1]["bytes"]) if rows else ""
    out = []
    if "speedup_min" in r:
        big = format_bytes(rows[-1]["bytes"])
        out.append({"question": f"KV transfer until stored, CPU-centric / triggered, {span} (paper Figs 5-7)",
                    "measured": f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}x",
                    "target": "the paper: 19-23x (its hardware)", "claim": "fig5_speedup"})
        if "pipelined_over_triggered_largest" in r:
            out.append({"question": f"The same, CPU-centric with the triggered path's blocks in flight / "
                                    f"triggered, {big}",
                        "measured": f"{r['pipelined_over_triggered_largest']:.2f}x",
                        "target": "above 1 if offload, not pipelining, is the cause (paper Sec. V-B)",
                        "claim": "offload_not_pipelining"})
        out.append({"question": f"Compute process CPU time per transfer, triggered / CPU-centric, {big}",
                    "measured": f"{r['compute_cpu_triggered_vs_cpu_largest']:.2g} (host with the emulated NIC: "
                                f"{r['host_cpu_triggered_vs_cpu_largest']:.2f})",
                    "target": "the paper: no CPU beyond the trigger setup (Sec. II-C)", "claim": "sec2c_compute_cpu"})
    else:
        error = next((e for p, e in failed.items() if p.startswith("transfer ")),
                     failed.get("transfers", "did not run"))
        out.append({"question": "KV transfer until stored, CPU-centric / triggered (paper Figs 5-7)",
                    "measured": f"failed: {error}", "target": "the paper: 19-23x (its hardware)"})
    if "calibrated_speedup_min" in r:
        out.append({"question": "Analytical model calibrated here: triggered speedup, 32 KiB-5 TiB",
                    "measured": f"{r['calibrated_speedup_min']:.2f}-{r['calibrated_speedup_max']:.2f}x",
                    "target": "the paper: 19-23x", "claim": "model_19x"})
    elif "model" in failed:
        out.append({"question": "Analytical model calibrated here: triggered speedup, 32 KiB-5 TiB",
                    "measured": f"failed: {failed['model']}", "target": "the paper: 19-23x"})
    if paper_causes is not None and "causes" in res:  # compute freed, as compute
        out += paper_causes.headline_rows(res)
    return out


# -- the command -------------------------------------------------------------------------------------------

def _sizes_arg(values: list[str]) -> list[int]:
    out = []
    for value in values:
        out += [int(v) * KIB for v in value.split(",") if v.strip()]
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb study paper", description=__doc__.splitlines()[0])
    add_study_args(parser, "paper")
    parser.add_argument("--sizes-kib", nargs="+", metavar="KIB",
                        help="KV sizes in KiB (multiples of 32), comma or space separated (default: 32 KiB "
                             "x4 up to the largest that fits; quick to 512 MiB)")
    parser.add_argument("--repeats", type=int,
                        help="samples per size and mode (default full 7, quick 5, smoke 2)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="tokens each of Fig. 2's turns generates (default 32, smoke 8)")
    parser.add_argument("--sample-wall-s", type=float,
                        help="under --profile: the wall time a paced sample may take at most, which caps "
                             "D per size (default full 60, quick 20, smoke 5)")
    args = parser.parse_args(argv)
    args.profile_obj = check_profile(parser, args, "paper")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    disk = shutil.disk_usage(Path(os.environ.get("TMPDIR", "/tmp"))).free
    args.largest_fit = largest_size(memory_available(), disk)
    if args.sizes_kib:
        args.sizes = sorted(set(_sizes_arg(args.sizes_kib)))
        for size in args.sizes:
            try:
                layout_for_size(size)  # now, not after the services started
            except ValueError as exc:
                parser.error(f"--sizes-kib: {exc}")
    elif args.profile_obj is not None:  # the paper's chunks: one per size up to 512 MiB (paper_scaled)
        from bench.study import paper_scaled as ps
        ladder = {"smoke": ps.SMOKE_SIZES, "quick": ps.QUICK_SIZES,
                  "full": ps.QUICK_SIZES + ps.FULL_EXTRA}[mode]
        args.sizes = [s for s in ladder if s <= max(args.largest_fit, QUICK_MAX_BYTES if mode != "full" else 0)]
    elif mode == "smoke":
        args.sizes = list(SMOKE_SIZES)
    else:
        largest = min(args.largest_fit, QUICK_MAX_BYTES) if mode == "quick" else args.largest_fit
        args.sizes = ladder_to(largest)
    if args.profile_obj is not None and not args.repeats:
        from bench.study import paper_scaled as ps
        args.repeats = ps.SCALED_REPEATS[mode]
    args.repeats = args.repeats or REPEATS[mode]
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    args.max_new_tokens = args.max_new_tokens or (8 if mode == "smoke" else 32)
    return args


def intro_text(args: argparse.Namespace) -> str:
    sizes = args.sizes
    return f"""
The paper's Figs. 5-7 (KV transfer time by KV size, CPU-centric against triggered, and the speedup) and
Fig. 2 (the eight steps of a turn), measured on the testbed, beside `kvtb simulate` (the paper's
analytical model as docs/analytical-model.md reads Tables II and III) and the same model calibrated to
this run.

How the paper's hardware maps here (docs/design.md in the repo): the GPU's KV buffers are a shared-memory KV
pool (here shaped like SmolLM2-135M's, fp32 and head_dim 64, with 32 layers and 2 KV heads so that one
token is exactly 32 KiB and a block of {BLOCK_TOKENS} tokens 1 MiB); the Cassini NIC's triggered
operations are the agent's standing triggered PUTs (one per block, fired by the compute process's
counter store); the GPU thread's flag write is an 8-byte store into the region; PCIe peer-to-peer DMA
is the agent reading the region; Slingshot is ZeroMQ over loopback TCP (DH-HMAC-CHAP, sealed
capsules); NVMe-oF and the drive are a storage node process writing files, each store durable before
its acknowledgement (group commit: one fdatasync and one journal fsync per batch of queued stores).
cudaMemcpy plus socket sends, the CPU-centric path, is the compute process copying each block out of
the pool and storing it through its own fabric client, waiting for the acknowledgement (policy `cpu`);
the same with as many blocks' stores in flight as the triggered path keeps (pipelined) separates what
pipelining alone gives from what offload gives.
Chunks are the product's: one extent per block with a MAC per layer ({NUM_LAYERS} parts). The agent
(the "NIC") runs on the same {os.cpu_count()} host cores as the compute process and the storage node:
this box has no offload engine.

Sizes: {format_bytes(sizes[0])} to {format_bytes(sizes[-1])} ({len(sizes)} sizes, {args.repeats} samples
of each path per size after a warm-up). The largest that fits here is {format_bytes(args.largest_fit)}:
the largest 32 KiB x 4^k that is at most {format_bytes(MAX_BYTES)}, MemAvailable / {MEMORY_SHARE} and
free disk / {MEMORY_SHARE} (the pool in shared memory, the storage node's page cache and file; quick
mode stops at {format_bytes(QUICK_MAX_BYTES)}). Sizes above one block move as 1 MiB blocks, as the
compute node stores them; a size under a block is one block of fewer tokens. Fig. 6's terabytes are
the models' only.
"""


SEED = paper_claims.SEED
# the study's claims: the transfers', the model's and Fig. 2's, and the separating experiments' (paper_causes)
CLAIMS = [*paper_claims.CLAIMS, *(getattr(paper_causes, "CLAIMS", None) or [])]


def run(args: argparse.Namespace) -> tuple[dict, str, str, str]:
    from bench.stack import use_credentials

    if args.profile_obj is not None:
        return run_profiled(args)
    study = new_study("paper", args, {
        "sizes_bytes": args.sizes, "repeats": args.repeats, "largest_fit_bytes": args.largest_fit,
        "block_tokens": BLOCK_TOKENS, "token_kv_bytes": TOKEN_KV_BYTES, "kv_parts": NUM_LAYERS,
        "fabric_security": "auth", "kv_mac": True, "storage_fsync": True,
        # --placement places Fig. 2's stack; the transfer rig (Figs. 5-7: the agent in this process,
        # the compute process of its own) runs unpinned, on every CPU, whatever the placement
        "placement_applies_to": "fig2 turn",
        "max_new_tokens": args.max_new_tokens, "cpu_pipelined_in_flight": triggered_in_flight(),
        "turn_model": "tiny random (smoke)" if args.smoke else "SmolLM2-135M-Instruct"})
    out = Path(args.out)
    directory = services_dir(args, "paper")
    use_credentials(directory)
    rows: list[dict] = []
    model = turn = got = None
    parts_s = study["results"]["part_seconds"] = {}
    try:
        total = 1 + len(args.sizes) * (args.repeats + 1) + (paper_causes.steps(study["mode"]) if paper_causes else 0)
        with Progress(total, "study paper", enabled=not args.json) as progress:
            started = time.monotonic()
            turn = run_part(study, "fig2 turn",
                            lambda: measure_turn(directory, args.smoke, args.max_new_tokens, args.keep_data,
                                                 args.placement))
            progress.update(note="Fig. 2 turn")
            parts_s["fig2 turn"] = time.monotonic() - started
            started = time.monotonic()
            got = run_part(study, "transfers", lambda: measure_transfers(
                study, args.sizes, args.repeats, directory / "transfers", progress))
            parts_s["transfers"] = time.monotonic() - started
            if paper_causes is not None:
                started = time.monotonic()
                causes = run_part(study, "causes", lambda: paper_causes.measure(
                    directory / "causes", study["mode"], progress, keep_data=args.keep_data))
                if causes is not None:
                    study["results"]["causes"] = causes
                    for part, error in (causes.get("failed") or {}).items():  # on the page, never dropped
                        study["failed"].append({"part": f"causes {part}", "error": error, "traceback": ""})
                parts_s["causes"] = time.monotonic() - started
    finally:
        if not args.keep_data:
            shutil.rmtree(directory, ignore_errors=True)
    if got:
        rows = summarize(got["samples"])
        study["results"]["transfers"] = {"rows": rows, "samples": got["samples"], "modes": got["modes"],
                                         "in_flight": got["in_flight"]}
        study["transfers"] = calibration_transfers(got["samples"])  # what `kvtb simulate --calibrate` reads
        model = run_part(study, "model", lambda: model_part(got["samples"]))
        if model:
            study["results"]["model"] = model
    study["ratios"] |= transfer_ratios(rows, model)
    if turn:
        study["results"]["turn"] = turn
        turn["follow_up"] = follow_up_figures(turn["gantt"])
    judge(study, CLAIMS)
    if rows:
        study["plots"] += run_part(study, "plots", lambda: paper_plots.transfer_plots(out, rows, model)) or []
    if turn:
        title = "Fig. 2: the eight steps of a turn and its follow-up"
        study["plots"].append(run_part(study, "fig2 plot",
                                       lambda: plot_gantt(out / "fig2_turn_steps.png", turn["gantt"], title)))
    title = "The paper's Figs. 2, 5-7: triggered against CPU-centric KV transfer"
    return study, title, intro_text(args), body_text(rows, model, turn)


def run_profiled(args: argparse.Namespace) -> tuple[dict, str, str, str]:
    """Figs. 5-7 under a hardware profile (bench/study/paper_scaled.py); Fig. 2 is not run under one."""
    from bench import scaled
    from bench.stack import use_credentials
    from bench.study import paper_scaled as ps

    profile = args.profile_obj
    study = new_study("paper", args, {
        "sizes_bytes": args.sizes, "repeats": args.repeats, "profile": profile.name,
        "chunk_bytes": ps.chunk_bytes(profile), "token_kv_bytes": TOKEN_KV_BYTES, "kv_parts": NUM_LAYERS,
        "fabric_security": "auth", "kv_mac": True, "storage_fsync": True, "readings": list(ps.READINGS),
        "dilation": args.dilation, "tolerance": ps.TOLERANCE, "placement_applies_to": "none (the rig is unpinned)"})
    directory = services_dir(args, "paper")
    use_credentials(directory)
    result = None
    try:
        total = len(args.sizes) * (1 + args.repeats) * (1 if args.dilation_value else 2)
        with Progress(total, f"study paper --profile {profile.name}", enabled=not args.json) as progress:
            result = run_part(study, "transfers", lambda: ps.run_scaled(study, args, profile, progress))
    finally:
        if not args.keep_data:
            shutil.rmtree(directory, ignore_errors=True)
    result = result or {"rows": [], "sizes": {}, "samples": []}
    study["results"]["scaled"] = result
    ds = [s["dilation"] for s in result["sizes"].values()]
    study["scale"] = scaled.record(profile, (min(ds), max(ds)) if ds else None,
                                   [s["pacing"] for s in result["sizes"].values()],
                                   "given" if args.dilation_value else "auto, per size")
    if ds:
        study["scale"]["dilation"] = ds[0] if len(set(ds)) == 1 else f"{min(ds):.0f}-{max(ds):.0f} (per size)"
    judge(study, ps.CLAIMS)
    if result["rows"]:
        study["plots"] += run_part(study, "plots", lambda: paper_plots.scaled_plots(Path(args.out), result)) or []
    for row in result["rows"]:
        key = f"{row['reading']}_{format_bytes(row['bytes']).replace(' ', '')}"
        if row["cpu_ratio"] and row["triggered_ratio"]:
            study["ratios"][f"cpu_testbed_over_model_{key}"] = row["cpu_ratio"]
            study["ratios"][f"triggered_testbed_over_model_{key}"] = row["triggered_ratio"]
    title = f"The paper's Figs. 5-7 under the hardware profile `{profile.name}` (virtual time)"
    return study, title, ps.intro_text(profile), ps.body_text(result)


TRANSFER_NOTE = (
    "Until stored: from the first block handed over until the last block's store is acknowledged. Pipelined: "
    "CPU-centric with as many blocks' stores in flight as the triggered path keeps. Stall ratio: the time the "
    "compute process's thread was blocked, CPU-centric / triggered (CPU-centric: the whole transfer; "
    "triggered: the descriptor writes and counter stores). CPU s/GB: CPU seconds per GB moved, the compute "
    "process's (all its threads) and the host's (the compute process's and the agent's, the emulated NIC "
    "that runs on this host's cores).")


def _opt(row: dict, key: str, fmt) -> str:
    return fmt(row[key]) if row.get(key) is not None else "-"


def body_text(rows: list[dict], model: dict | None, turn: dict | None) -> str:
    """The page's tables: the transfers' medians, the calibrated model, the turn's steps."""
    parts = []
    if rows:
        head = ["KV size", "blocks", "CPU-centric", "pipelined", "triggered", "speedup", "pipelined / triggered",
                "stall ratio", "compute CPU s/GB CPU-centric", "triggered", "host CPU s/GB CPU-centric",
                "triggered"]
        x = "{:.2f}x".format
        body = [[format_bytes(r["bytes"]), r["blocks"], format_seconds(r["cpu_e2e_s"]),
                 _opt(r, "pipelined_e2e_s", format_seconds), format_seconds(r["triggered_e2e_s"]),
                 x(r["speedup"]), _opt(r, "pipelined_speedup", x), f"{r['stall_ratio']:.0f}x",
                 f"{r['cpu_compute_cpu_s_per_gb']:.3g}", f"{r['triggered_compute_cpu_s_per_gb']:.3g}",
                 f"{r['cpu_host_cpu_s_per_gb']:.3g}", f"{r['triggered_host_cpu_s_per_gb']:.3g}"]
                for r in rows]
        parts += ["## Transfers (medians)", "", TRANSFER_NOTE, "", markdown_table(head, body), ""]
    if model:
        fits = [[f["mode"], format_seconds(f["fixed_s"]), f"{f['per_byte_s']:.3g} s",
                 f"{f['bytes_per_s'] / 1e9:.2f}"] for f in model["calibration"]["fits"]]
        parts += ["## The model calibrated here", "",
                  markdown_table(["path", "fixed per transfer", "per byte", "GB/s"], fits), "",
                  "Each path's samples fitted as seconds = fixed + per_byte x bytes (bench.calibration), "
                  "then swept to 5 TiB in 512 MiB chunks as the paper's model is (Fig. 6).", ""]
    if turn:
        steps = [[f"{r['step']}. {r['name']}", r["turn"], f"{r['start_ms']:.1f}", f"{r['end_ms']:.1f}",
                  r["bytes"]] for r in turn["gantt"]["rows"]]
        parts += ["## Fig. 2: the turn's steps", "",
                  markdown_table(["step", "turn", "start ms", "end ms", "bytes"], steps), ""]
    return "\n".join(parts)


main = main_of(parse_args, run)
