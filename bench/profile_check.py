"""`kvtb profile check NAME`: the dilation D a hardware profile needs on this machine, and what it costs.

A paced operation takes max(real, D x modeled) of wall time (scale.dilation), so D must cover the
slowest real operation against its model. Each kind of scale.ops.KINDS the profile can cost is
measured at the studies' sizes, with the product's own code where cheap (the model runner's step,
chunk_format's sealing and checking) or a stated proxy (ZeroMQ loopback, a file and fdatasync); a kind
needs its worst shape's median real / modeled; D is the largest need x margin (dilation_needed).
Transfers are charged for virtual bytes: real x profile.kv_scale(46,080), SmolLM2-135M's fp32 KV a
token (30 layers x 2 x 3 KV heads x 64 x 4 B); without a virtual model sizes are sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.results import format_bytes, format_seconds, format_table, read_json
from compute_node.settings import ComputeSettings
from scale import costs, ops
from scale import profile as pf
from scale.dilation import dilation_needed

KIB, MIB = 1024, 1024 * 1024
REAL_KV_BYTES_PER_TOKEN, LAYERS = 30 * 2 * 3 * 64 * 4, 30  # SmolLM2-135M in fp32: 46,080 B a token
BLOCK_TOKENS, SWAP_BYTES, CONTEXT = ComputeSettings.block_tokens, 64 * MIB, 512  # the compute node's block; a big swap
PAPER_SIZES, QUICK_MAX_BYTES = (32 * KIB, MIB, 32 * MIB, 512 * MIB), 32 * MIB  # the paper study's
PAPER_TOKEN_BYTES, PAPER_PARTS = 32 * KIB, 32              # its pool: 32 KiB a token, 32 layers
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
STEP_SHAPES = (("decode b1", f"decode, batch 1, context {CONTEXT}", [(CONTEXT, 1)]),
               ("decode b32", f"decode, batch 32, context {CONTEXT}", [(CONTEXT, 1)] * 32),
               ("prefill", f"prefill of {CONTEXT} tokens", [(0, CONTEXT)]))
HOW = {"gpu_step": "the model runner's step", "swap_out": "numpy copy", "swap_in": "numpy copy",
       "cpu_copy": "copy out + seal (a MAC a layer), as CpuStore.put",
       "host_to_wire": "proxy: ZeroMQ loopback send + receive", "nic_put": "seal the block's views",
       "nic_get": "check a sealed value + scatter its KV", "nvme_write": "proxy: file write + fdatasync",
       "nvme_read": "proxy: file read, its pages dropped first"}
# What each study mostly waits for (its dominant op kind and shape); the paper's transfers are modeled.
STUDIES = {"paper": ("nvme_write", "block", "Figs. 5-7 store KV blocks, each durable before its ack"),
           "poster": ("gpu_step", "decode b32", "batches of 16 requests decoding, recomputes"),
           "scalellm": ("gpu_step", "decode b32", "up to 32 sequences decoding a step"),
           "eviction": ("gpu_step", "prefill", "its real check: prompts up to 2,048 tokens, 8-token replies")}


# -- pure: sizes, the recommendation, the estimates, the table -------------------------------------------

def transfer_sizes(p: pf.Profile, quick: bool) -> dict[str, list[tuple[int, str | None]]]:
    """kind -> [(real bytes, tag)]: a block (tag "block"), the swaps 64 MiB too; without a virtual model
    the paper study's sizes (its 1 MiB block tagged), --quick to 32 MiB."""
    kinds = [k for k in ops.KINDS if k != "gpu_step"]
    if p.model is None:
        sizes = [(n, "block" if n == MIB else None) for n in PAPER_SIZES if not quick or n <= QUICK_MAX_BYTES]
        return {k: sizes for k in kinds}
    block = [(BLOCK_TOKENS * REAL_KV_BYTES_PER_TOKEN, "block")]
    return {k: block + ([(SWAP_BYTES, None)] if k.startswith("swap") else []) for k in kinds}


def shape_row(shape: str, real_s: float, modeled_s: float, tag: str | None = None, **more) -> dict:
    return {"shape": shape, "tag": tag, "real_s": real_s, "modeled_s": modeled_s, "need": real_s / modeled_s,
            **more}


def kind_summary(rows: list[dict], how: str = "") -> dict:
    """A kind: its worst shape's real, modeled and need (the D it needs), and every shape."""
    worst = max(rows, key=lambda r: r["need"])
    return {"real_s": worst["real_s"], "modeled_s": worst["modeled_s"], "need": worst["need"],
            "worst_shape": worst["shape"], "how": how, "shapes": rows}


def recommend(kinds: dict[str, dict], margin: float) -> tuple[float, str]:
    """(D, the kind that sets it): dilation_needed over the kinds' needs, x margin, at least 1."""
    d, need = dilation_needed({k: {"ops": 1, "worst_ratio": v["need"]} for k, v in kinds.items()}, margin)
    return d, max(need, key=need.get, default="")


def study_estimates(kinds: dict, dilation: float, recorded: dict[str, dict], work: dict[str, tuple],
                    paper_virtual: dict[str, float] | None = None, tiny: bool = False) -> dict[str, dict]:
    """{study: {quick|full: {estimate_s, basis}, ...}}. paper, given its transfers' modeled virtual
    seconds by mode: D x those + the rest of its recorded run at real speed. The others: the recorded
    run's elapsed_s (as quick) x max(1, D x modeled / real of the dominant op's shape), and x the full /
    quick work for full. None without a recorded run."""
    out = {}
    for study, (kind, tag, why) in STUDIES.items():
        row = next((r for r in kinds.get(kind, {}).get("shapes", []) if r["tag"] == tag), None)
        paced = max(1.0, dilation * row["modeled_s"] / row["real_s"]) if row else 1.0
        ratio, how, rec = *work[study], recorded.get(study)
        e = out[study] = {"dominant": f"{kind} {row['shape']}" if row else f"{kind} (not paced here)",
                          "paced_over_real": paced, "full_over_quick_work": ratio}
        if study == "paper" and paper_virtual:
            e.update(dominant="its transfers (modeled)", paced_over_real=None)
        src = rec and (f"the recorded {rec['mode']} run's {rec['elapsed_s']:.0f} s "
                       f"(docs/results/{study}/results.json or docs/results/all.json.gz)")
        for m in ("quick", "full"):
            if e["dominant"] == "its transfers (modeled)":
                e[m] = {"estimate_s": paper_virtual[m],
                        "basis": "`kvtb study paper --profile`'s sizes, each sample D x its modeled time, and "
                                 "two rigs per size (bench.study.paper_scaled.estimate_wall_s); D per size comes "
                                 "from its own warm-up at D = 1, this D stands in: an upper estimate"}
            elif not rec:
                e[m] = {"estimate_s": None, "basis": f"no recorded run: docs/results/{study}/results.json(.gz) or its step in "
                                                        "docs/results/all.json.gz"}
            else:
                quick_s = rec["elapsed_s"] / (ratio if rec["mode"] == "full" else 1.0)
                e[m] = {"estimate_s": quick_s * paced * (ratio if m == "full" else 1.0), "basis": src
                        + (f" / {ratio:.3g} (full / quick work)" if rec["mode"] == "full" else "")
                        + (f" x {paced:.3g} (D x modeled / real of {e['dominant']}: {why})" if row
                           else f" x 1 ({kind}, its dominant op, is not paced here; its paced transfers "
                                "are left out: a floor)")
                        + (f" x {ratio:.3g} (full / quick work: {how})" if m == "full" else "")
                        + ("; gpu_step timed on the tiny model: overstated" if tiny and row else "")}
    return out


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    units = (("d", 86400), ("h", 3600), ("min", 60))
    unit, scale = next(((u, s) for u, s in units if seconds >= s), ("s", 1))
    return f"{seconds / scale:.3g} {unit}"


def table(report: dict) -> str:
    """The readable report."""
    rows = [[kind, r["shape"], format_seconds(r["real_s"]), format_seconds(r["modeled_s"]),
             f"{r['need']:.3g}", k["how"] if i == 0 else ""]
            for kind, k in report["kinds"].items() for i, r in enumerate(k["shapes"])]
    studies = [[s, duration(e["quick"]["estimate_s"]), duration(e["full"]["estimate_s"]), e["dominant"],
                "-" if e["paced_over_real"] is None else f"{e['paced_over_real']:.3g}",
                f"{e['full_over_quick_work']:.3g}"]
               for s, e in report["studies"].items()]
    by, d = report["dilation_set_by"], report["dilation"]
    return "\n".join([
        (f"profile {report['profile']}: virtual bytes = real x {report['kv_scale']:.4g}; median of "
         f"{report['repeats']} repeats a shape; gpu_step: {report['step_model']}"), "",
        format_table(["kind", "shape (real bytes)", "real", "modeled", "D needed", "measured as"], rows), "",
        f"recommended D: {d:.4g}" + (f" ({by} needs {report['kinds'][by]['need']:.4g}, x margin "
                                     f"{report['margin']:g})" if by else ""), "",
        f"estimated wall time of each study under {report['profile']} at D = {d:.4g} (estimates, not runs):",
        format_table(["study", "quick", "full", "dominant op", "x paced/real", "full/quick work"], studies),
        *[f"  {s} {m}: {e[m]['basis']}" for s, e in report["studies"].items() for m in ("quick", "full")],
        *[f"note: {n}" for n in report["notes"]]])


def work_ratios(paper_largest: int) -> dict[str, tuple[float, str]]:
    """Each study's full / quick work, counted from its own settings (bench.study.*), and how."""
    from bench.study import eviction, paper, poster, scalellm
    pa = [sum(paper.ladder_to(top)) * paper.REPEATS[m]
          for m, top in (("full", paper_largest), ("quick", min(paper_largest, paper.QUICK_MAX_BYTES)))]
    po = [sum(w.requests * (w.input_tokens + w.output_tokens) for w, _, _ in poster.plan(poster.MODES[m]))
          for m in ("full", "quick")]
    sc = [sum(lv) * scalellm.REQUESTS_PER_CLIENT[m] * scalellm.MAX_TOKENS[m]
          for m, lv in (("full", scalellm.LEVELS), ("quick", scalellm.QUICK_LEVELS))]
    ev = [eviction.REAL_REQUESTS[m] * len(eviction.MODE_REAL_POLICIES[m]) for m in ("full", "quick")]
    return {"paper": (pa[0] / pa[1], f"bytes x repeats, sizes to {format_bytes(paper_largest)} here"),
            "poster": (po[0] / po[1], "requests x tokens over its points"),
            "scalellm": (sc[0] / sc[1], "requests x max_tokens over its levels"),
            "eviction": (ev[0] / ev[1], "its real check's requests x policies")}


# -- measuring (I/O) ------------------------------------------------------------------------------------

def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def median_s(op, repeats: int) -> float:
    """op() -> its seconds: one warm-up, then the median of `repeats`."""
    op()
    return statistics.median(op() for _ in range(repeats))


def step_model(quick: bool):
    """(model, what it is): SmolLM2-135M as the compute node loads it; with --quick, or when it cannot
    be loaded, a tiny random Llama of bench.study.tiny_model's shape."""
    import torch
    reason = "--quick"
    if not quick:
        try:
            from compute_node.model_loader import load_model
            from compute_node.settings import ComputeSettings
            return load_model(ComputeSettings().model_cache_dir, 1)[0], "SmolLM2-135M (fp32), 1 torch thread"
        except Exception as exc:  # noqa: BLE001 - any failure: the tiny model, and said so
            reason = f"SmolLM2-135M could not be loaded: {type(exc).__name__}: {exc}"
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=4096)
    return LlamaForCausalLM(config).eval(), f"a TINY random 2-layer Llama ({reason}), 1 torch thread"


def measure_steps(p: pf.Profile, model, repeats: int) -> list[dict]:
    import torch

    from compute_node.llama import pool_shape
    from compute_node.model_runner import ModelRunner, SeqRun
    per_seq = -(-(CONTEXT + 1) // BLOCK_TOKENS)
    runner = ModelRunner(model, torch.zeros(pool_shape(model.config, 32 * per_seq, BLOCK_TOKENS)))
    rows = []
    for tag, label, batch in STEP_SHAPES:
        runs = [SeqRun([100 + (7 * s + i) % 1000 for i in range(new)], ctx,
                       range(s * per_seq, (s + 1) * per_seq)) for s, (ctx, new) in enumerate(batch)]
        rows.append(shape_row(label, median_s(lambda r=runs: timed(runner.step, r), repeats),
                              ops.modeled_s(p, "gpu_step", batch=batch), tag))
    return rows


def measure_transfers(p: pf.Profile, quick: bool, repeats: int) -> dict[str, dict]:
    import zmq

    from fabric import chunk_format as cf
    mac_key, key, paper = os.urandom(32), os.urandom(16), p.model is None
    scale = p.kv_scale(REAL_KV_BYTES_PER_TOKEN)

    def seal(buf, copy):  # as CpuStore.put: the copy out of "GPU memory" (or, as the agent, its views)
        tokens = (len(buf) // PAPER_TOKEN_BYTES or 1) if paper else BLOCK_TOKENS
        header = cf.ChunkHeader("u", "c", 0, 0, tokens, len(buf), b"\1" * 16, time.time_ns(),
                                kv_parts=PAPER_PARTS if paper else LAYERS)
        ids = [np.arange(tokens, dtype="<u4").tobytes()]
        return cf.sealed(mac_key, key, header, ids, [bytes(memoryview(buf)) if copy else memoryview(buf)])

    def land(value, out):  # as a GET lands: every MAC checked, the KV scattered into the pool
        _, layout = cf.check_value(mac_key, key, value)
        cf.scatter(cf.cut([value], layout.kv_offset, layout.kv_bytes), [memoryview(out)])

    def write(buf):
        with open(path, "wb") as f:
            f.write(memoryview(buf))
            f.flush()
            os.fdatasync(f.fileno())

    def read(out):
        with open(path, "rb", buffering=0) as f:
            f.readinto(memoryview(out))

    def dropped(buf, back):  # nvme_read's file: on the drive, out of the page cache
        if not os.path.exists(path) or os.path.getsize(path) != len(buf):
            write(buf)
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return back

    run = {"swap_out": lambda b, o: timed(np.copyto, o, b), "swap_in": lambda b, o: timed(np.copyto, b, o),
           "cpu_copy": lambda b, o: timed(seal, b, True), "nic_put": lambda b, o: timed(seal, b, False),
           "nic_get": lambda b, o: timed(land, b"".join(seal(b, False)), o),
           "host_to_wire": lambda b, o: timed(lambda: (tx.send(b, copy=False), rx.recv(copy=False))),
           "nvme_write": lambda b, o: timed(write, b), "nvme_read": lambda b, o: timed(read, dropped(b, o))}
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    tx.connect(f"tcp://127.0.0.1:{rx.bind_to_random_port('tcp://127.0.0.1')}")
    out = {}
    try:
        with tempfile.TemporaryDirectory(prefix="kvtb-profile-check-") as d:  # mode 0700
            path = os.path.join(d, "block")
            for kind, sizes in transfer_sizes(p, quick).items():
                rows = []
                for n, tag in sizes:
                    buf, back = np.full(n, 7, dtype=np.uint8), np.empty(n, dtype=np.uint8)
                    label = (f"block: {BLOCK_TOKENS} tokens, " if tag and not paper else "") + format_bytes(n)
                    real = median_s(lambda k=kind, b=buf, o=back: run[k](b, o), repeats)
                    rows.append(shape_row(label, real, ops.modeled_s(p, kind, n * scale), tag, real_bytes=n,
                                          virtual_bytes=n * scale))
                out[kind] = kind_summary(rows, HOW[kind])
    finally:
        tx.close(0)
        rx.close(0)
        ctx.term()
    return out


def recorded_runs() -> dict[str, dict]:
    """Each study's recorded run: elapsed_s, mode and (the paper's) its transfers' seconds; from its
    results.json where a run left one, else from the committed run's all.json.gz."""
    try:
        committed = {e["name"]: e.get("result") for e in read_json(RESULTS / "all.json.gz").get("steps", [])}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        committed = {}
    out = {}
    for study in STUDIES:
        try:
            try:
                data = read_json(RESULTS / study / "results.json")  # or results.json.gz
            except OSError:
                data = committed[study]
            parts = (data.get("results") or {}).get("part_seconds") or {}
            out[study] = {"elapsed_s": float(data["elapsed_s"]), "mode": str(data.get("mode", "quick")),
                          "transfers_s": float(parts.get("transfers", 0.0))}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return out


def check(p: pf.Profile, quick: bool, margin: float, repeats: int, threads: int = 0) -> dict:
    """The report of `kvtb profile check`; the steps run at `threads` torch threads (0: every core), as
    the compute node of the run that uses the D will."""
    from bench.study import paper
    kinds, note = {}, "not paced: the profile names no gpu or no virtual model"
    if ops.applies(p, "gpu_step"):
        import torch
        saved = torch.get_num_threads()
        torch.set_num_threads(threads or os.cpu_count() or 1)
        try:
            model, note = step_model(quick)
            kinds["gpu_step"] = kind_summary(measure_steps(p, model, repeats), HOW["gpu_step"])
        finally:
            torch.set_num_threads(saved)
    kinds |= measure_transfers(p, quick, repeats)
    kinds = {k: kinds[k] for k in ops.KINDS if k in kinds}
    dilation, by = recommend(kinds, margin)
    largest = paper.largest_size(paper.memory_available(), shutil.disk_usage(tempfile.gettempdir()).free)
    tops = {"quick": min(largest, paper.QUICK_MAX_BYTES), "full": largest}
    from bench.study import paper_scaled
    virtual = {m: paper_scaled.estimate_wall_s([s for s in (paper_scaled.QUICK_SIZES if m == "quick" else
                                                            paper_scaled.QUICK_SIZES + paper_scaled.FULL_EXTRA)
                                                if s <= max(top, paper.QUICK_MAX_BYTES)], m, dilation, p)
               for m, top in tops.items()}
    notes = [("host_to_wire, nvme_write and nvme_read are proxies (ZeroMQ loopback, a file in a temp dir); "
              "a storage node's real path (fabric auth, capsules, its journal) is heavier")]
    if "TINY" in note:
        notes.append("gpu_step ran on a tiny model: its need, and so D, is far below SmolLM2's; run without "
                     "--quick for the D to use")
    return {"profile": p.name, "quick": quick, "margin": margin, "repeats": repeats, "cpus": os.cpu_count(),
            "kv_scale": p.kv_scale(REAL_KV_BYTES_PER_TOKEN), "step_model": note, "kinds": kinds,
            "real_kv_bytes_per_token": REAL_KV_BYTES_PER_TOKEN, "dilation": dilation, "dilation_set_by": by,
            "notes": notes,
            "studies": study_estimates(kinds, dilation, recorded_runs(), work_ratios(largest), virtual,
                                       tiny="TINY" in note)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvtb profile check", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="a profile in deploy/profiles (or a path to a .yaml)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--margin", type=float, default=2.0, help="D = the largest need x margin (default 2)")
    parser.add_argument("--pacing", action="store_true",
                        help="then run a plain decode step and a plain 64 MiB host copy paced at the D found "
                             "(or --dilation): their virtual time beside the model's")
    parser.add_argument("--dilation", type=float, help="with --pacing: this D instead of the one recommended")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model for gpu_step, sizes to 32 MiB, 3 repeats (default 5)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.margin <= 0:
        parser.error("--margin must be positive")
    try:
        p = pf.load(args.name)
    except pf.ProfileError as exc:
        print(f"kvtb profile check: {exc}", file=sys.stderr)
        return 2
    report = check(p, args.quick, args.margin, 3 if args.quick else 5)
    if args.pacing:
        report["pacing"] = pacing(p, args.dilation or report["dilation"], args.quick)
    print(json.dumps(report, indent=2) if args.json else table(report))
    if args.pacing and not args.json:
        from bench import pacing_exactness
        print("\n".join(pacing_exactness.lines(report["pacing"]["kinds"], report["pacing"]["dilation"])))
    return 0


def pacing(p: pf.Profile, dilation: float, quick: bool) -> dict:
    """bench.pacing_exactness at D: the copy, and a decode step of the study's model (1 torch thread)."""
    import torch

    from bench import pacing_exactness
    from compute_node.llama import pool_shape
    from compute_node.model_runner import ModelRunner, SeqRun
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, note = step_model(quick)
        per_seq = -(-(CONTEXT + 1) // BLOCK_TOKENS)
        runner = ModelRunner(model, torch.zeros(pool_shape(model.config, per_seq, BLOCK_TOKENS)))
        runs = [SeqRun([101], CONTEXT, range(per_seq))]
        kinds = pacing_exactness.exactness(p, dilation, 5, lambda: runner.step(runs))
    finally:
        torch.set_num_threads(threads)
    return {"dilation": dilation, "step_model": note, "kinds": kinds}


if __name__ == "__main__":
    raise SystemExit(main())
