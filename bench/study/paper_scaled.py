"""`kvtb study paper --profile NAME`: the paper's Figs. 5-7 on the testbed, under a hardware profile.

The same two paths as the unprofiled study (bench/study/paper.py: the compute process's CPU-centric
copy-and-send, the agent's standing triggered PUTs, one storage node process writing files), with
every hardware operation paced by the profile (scale/): the compute process's copy out of the pool
and its host stack (`cpu_copy`), the NIC's DMA from host memory (`host_to_wire`), the NIC's
peer-to-peer gather onto the wire (`nic_put`), the storage node's drive (`nvme_write`, a server of
one whose command starts when the sender's modeled link has delivered the data). Each takes
max(real, D x modeled) of wall time; times are reported as wall / D (virtual time).

Blocks are the profile's transfer chunk (the paper's 512 MB: "chunks of 512 MB (unless transferring a
smaller size KV cache)"), so a size up to 512 MiB is one chunk, as in the paper's model.

Two readings of where a triggered transfer ends (docs/analytical-model.md):
- `nvme_write`: when its last block's store is acknowledged, after the NVMe write (the agent's
  PUT-done counter);
- `nvme_queue`: when the storage node's queue accepted its last block (the node's mark), before the
  write.
The CPU-centric path ends at the acknowledgement in both: its host thread waits for it.

D is chosen per size (`--dilation auto`): the costs span five orders of magnitude (1.7 us for a 32 KiB
DMA, 345 ms for a 512 MiB chunk), and one D for all would either violate at the small sizes or take
hours at the large ones. A warm-up at D = 1 measures each operation kind's real / modeled and each
path's; D is at least 2 x the worst kind (no operation overruns its budget), and up to 10 x the
worst path (the real time between paced operations) as far as a sample stays within
`--sample-wall-s` of wall time: a path cap that binds shows in the fidelity, never hidden.
"""
from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench import analytical_model as am
from bench import scaled
from bench.results import format_bytes, format_seconds, services_dir
from bench.stats import median
from bench.study import paper_rig
from bench.study import paper as base
from bench.study import paper_claims as pc
from bench.study.claims import Claim, Evidence, Test
from bench.study.report import run_part
from scale import costs
from scale import dilation as dl
from scale import profile as pf

READINGS = ("nvme_write", "nvme_queue")
MODES = ("cpu", "triggered")  # the two paths the model has
TOLERANCE = 0.15       # the fidelity band: within +-15% of the analytical model
KIND_MARGIN, PATH_MARGIN = 2.0, 10.0
SAMPLE_WALL_S = {"full": 60.0, "quick": 20.0, "smoke": 5.0}
SCALED_REPEATS = {"full": 3, "quick": 3, "smoke": 1}  # a verdict needs 3 (bench.study.claims)
# A paced warm-up sample costs as much wall time as a measured one; the warm-up at D = 1 has run the
# same code already, and a budget of D x modeled absorbs a first sample's page faults (violations say
# if it did not).
PACED_WARMUP = {"full": True, "quick": False, "smoke": False}
QUICK_SIZES = tuple(32 * base.KIB * 4 ** k for k in range(8))  # 32 KiB .. 512 MiB
SMOKE_SIZES = (32 * base.KIB, 1 * base.MIB)
FULL_EXTRA = (2 * base.GIB,)  # four chunks: the pipeline of the triggered path


# -- the models (pure) ---------------------------------------------------------------------------------

def model_params(reading: str) -> tuple[am.ModelParams, am.ModelParams]:
    """(CPU-centric, triggered) analytical parameters for a reading: the CPU path always ends after the
    NVMe write; the triggered path without it when it ends at the NVMe queue."""
    base_p = am.ModelParams()
    trig = base_p if reading == "nvme_write" else dataclasses.replace(base_p, include_nvme=False)
    return base_p, trig


def model_times(size: int, reading: str, profile: pf.Profile | None = None) -> dict[str, float]:
    """The model's time of each path for `size` bytes: `bench/analytical_model.py` (Tables II and III),
    or a profile's own costs (scale.costs: the same equations over its links), in its chunks: the
    CPU-centric one after another, the triggered pipelined."""
    if profile is None or profile.name == "paper":
        cpu_p, trig_p = model_params(reading)
        return {"cpu": am.cpu_centric_s(size, cpu_p), "triggered": am.triggered_s(size, trig_p)}
    p, chunk = profile.with_transfer_ends(reading), chunk_bytes(profile)
    parts = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
    return {"cpu": costs.path_s([costs.cpu_centric_stages(p, m) for m in parts], False),
            "triggered": costs.path_s([costs.triggered_stages(p, m) for m in parts], True)}


def chunk_bytes(profile: pf.Profile) -> int:
    return profile.chunk_bytes or base.BLOCK_TOKENS * base.TOKEN_KV_BYTES


def layout_for(size: int, chunk: int):
    """The pool holding `size` bytes in blocks of min(size, chunk)."""
    from hostmem.kv_layout import KvLayout

    block = min(size, chunk)
    if size % block or block % base.TOKEN_KV_BYTES:
        raise ValueError(f"{size} bytes are not whole blocks of {block} bytes of whole tokens")
    return KvLayout(num_blocks=size // block, num_layers=base.NUM_LAYERS, num_kv_heads=base.NUM_KV_HEADS,
                    block_tokens=block // base.TOKEN_KV_BYTES, head_dim=base.HEAD_DIM, dtype_bytes=base.DTYPE_BYTES)


def choose_dilation(kinds: dict, path_ratios: Sequence[float], sample_model_s: float, wall_cap_s: float) -> dict:
    """D for one size from its warm-up at D = 1: at least the worst kind x KIND_MARGIN (so that no
    operation overruns its budget: the violations a claim is judged on), and up to the worst path x
    PATH_MARGIN (the real time between paced operations, polls and acknowledgements, which D makes
    small in virtual time) as far as a sample (sample_model_s of virtual time) stays within wall_cap_s."""
    kind_d, need = dl.dilation_needed(kinds, KIND_MARGIN)
    path_d = PATH_MARGIN * max(path_ratios) if path_ratios else 1.0
    cap = max(1.0, wall_cap_s / sample_model_s) if sample_model_s > 0 else path_d
    wanted = max(kind_d, path_d, 1.0)
    return {"dilation": max(kind_d, min(path_d, cap), 1.0), "wanted": wanted, "cap": cap,
            "capped": path_d > max(cap, kind_d), "kind_needs": need, "path_ratios": list(path_ratios)}


RIG_START_S = 6.0  # a storage node process, the agent and the compute process, per rig (two per size)


def estimate_wall_s(sizes: Sequence[int], mode: str, dilation: float, profile: pf.Profile | None = None) -> float:
    """The wall time of the profiled transfers: per size SCALED_REPEATS samples of each path (and a
    paced warm-up in full mode), each D x its modeled time, and two rigs. An estimate: D per size is
    chosen by its own warm-up at D = 1, not known before it; `dilation` stands in for every size."""
    total = 0.0
    for size in sizes:
        per_sample = [dilation * t for t in model_times(size, "nvme_write", profile).values()]
        total += (SCALED_REPEATS[mode] + PACED_WARMUP[mode]) * sum(per_sample) + 2 * RIG_START_S
    return total


def fidelity_rows(samples: Sequence[dict], profile: pf.Profile | None = None) -> list[dict]:
    """Per size and reading: the median virtual time of each path, the model's, their ratio, the speedup."""
    rows = []
    for size in sorted({s["bytes"] for s in samples}):
        for reading in READINGS:
            model = model_times(size, reading, profile)
            row = {"bytes": size, "reading": reading}
            for mode in ("cpu", "triggered"):
                got = [s["virtual_s"][reading] for s in samples
                       if s["bytes"] == size and s["mode"] == mode and s["virtual_s"].get(reading)]
                measured = median(got) if got else None
                row[f"{mode}_s"], row[f"{mode}_model_s"] = measured, model[mode]
                row[f"{mode}_ratio"] = measured / model[mode] if measured else None
            row["speedup"] = row["cpu_s"] / row["triggered_s"] if row["cpu_s"] and row["triggered_s"] else None
            row["model_speedup"] = model["cpu"] / model["triggered"]
            row["within"] = all(r is not None and abs(r - 1) <= TOLERANCE
                                for r in (row["cpu_ratio"], row["triggered_ratio"]))
            rows.append(row)
    return rows


# -- the rig, paced ------------------------------------------------------------------------------------

@contextlib.contextmanager
def rig(directory: Path, profile: str, dilation: float) -> Iterator[tuple]:
    """paper.transfer_rig with every process under the profile at D (this process: the agent)."""
    scaled.apply(profile, dilation, kv_scale=1.0)  # Figs. 5-7 are by size: bytes are charged as they are
    try:
        with base.transfer_rig(directory, fabric_timeout_s=30.0 + 5.0 * dilation) as r:
            yield r
    finally:
        scaled.clear()


def pacing_snapshots(r, reset: bool = False) -> list[dict]:
    """The three processes' pacer snapshots: compute, agent (this process), storage."""
    agent, storage, _, compute = r
    pacer = dl.current()
    snaps = [compute.call(("pacing", reset)), pacer.snapshot() if pacer else None, scaled.storage_pacing(storage)]
    if reset and pacer:
        pacer.reset()
    return [s for s in snaps if s]


def sample(r, mode: str, size: int, rep: int, tag: str, dilation: float) -> dict:
    """One paced transfer; its wall and virtual times under both readings."""
    agent, storage, admin, compute = r
    user, context = f"paper-{tag}-{mode}-{rep}", f"ctx-{uuid.uuid4().hex[:8]}"
    out = compute.call(("run", mode, user, context), timeout_s=900.0 + 30 * dilation)
    accepted = (scaled.storage_pacing(storage).get("marks") or {}).get("store_accepted")
    if mode == "triggered":
        agent.drop_context(user, context)
    paper_rig.wait_empty(admin, base.NSID, timeout_s=120.0 + dilation)
    wall = {"nvme_write": out["e2e_s"]}
    if mode == "triggered" and accepted:
        wall["nvme_queue"] = accepted - out["t0"]
    elif mode == "cpu":
        wall["nvme_queue"] = out["e2e_s"]  # the host thread waits for the acknowledgement either way
    return {"mode": mode, "bytes": size, "rep": rep, "dilation": dilation, "wall_s": wall,
            "virtual_s": {k: v / dilation for k, v in wall.items()}, "blocks": out["blocks"]}


def with_region(r, size: int, chunk: int, body):
    """Register a pool of `size` bytes with the agent, attach the compute process, run body()."""
    from hostmem.layout_proto import layout_to_proto
    from hostmem.region import Region

    agent, _, _, compute = r
    L = layout_for(size, chunk)
    region = Region.create(f"kvtb-paper-{uuid.uuid4().hex[:8]}", L.region_bytes, L.counter_offset, L.counter_count)
    try:
        base._fill(region, L.num_blocks * L.block_bytes)
        reg = agent.register(region.name, L.region_bytes, base.KEY, L.counter_offset, L.counter_count,
                             layout_to_proto(L), owner="bench")
        try:
            compute.call(("attach", region.name, dataclasses.asdict(L)))
            try:
                return body()
            finally:
                compute.call(("detach",))
        finally:
            agent.deregister(reg.region_id, base.KEY)
    finally:
        region.close()


def calibrate(directory: Path, profile: pf.Profile, sizes: Sequence[int], wall_cap_s: float, progress) -> dict:
    """At D = 1: per size, a warm-up and one sample of each path; the D each size gets."""
    out = {}
    with rig(directory, profile.name, 1.0) as r:
        for size in sizes:
            def body(size=size):
                tag = uuid.uuid4().hex[:6]
                for mode in MODES:
                    sample(r, mode, size, -1, tag, 1.0)
                pacing_snapshots(r, reset=True)
                got = [sample(r, mode, size, 0, tag, 1.0) for mode in MODES]
                kinds = dl.merge(pacing_snapshots(r, reset=True))["kinds"]
                ratios = []
                for s in got:
                    for reading, wall in s["wall_s"].items():
                        model = model_times(size, reading, profile)[s["mode"]]
                        ratios.append(wall / model)
                model_a = max(model_times(size, "nvme_write", profile).values())
                return choose_dilation(kinds, ratios, model_a, wall_cap_s)
            out[size] = with_region(r, size, chunk_bytes(profile), body)
            progress.update(note=f"{format_bytes(size)}: D {out[size]['dilation']:.0f}")
    return out


def measure(directory: Path, profile: pf.Profile, size: int, dilation: float, repeats: int, progress,
            warm_up: bool = True) -> dict:
    """At D: a warm-up (unless not), then `repeats` samples of each path in alternating order; the
    pacers' records."""
    with rig(directory, profile.name, dilation) as r:
        def body():
            tag = uuid.uuid4().hex[:6]
            if warm_up:
                for mode in MODES:
                    sample(r, mode, size, -1, tag, dilation)
                pacing_snapshots(r, reset=True)
            got = []
            for rep in range(repeats):
                order = MODES if rep % 2 == 0 else MODES[::-1]
                got += [sample(r, mode, size, rep, tag, dilation) for mode in order]
                progress.update(note=f"{format_bytes(size)} at D {dilation:.0f}")
            return {"samples": got, "pacing": dl.merge(pacing_snapshots(r))}
        return with_region(r, size, chunk_bytes(profile), body)


def run_scaled(study: dict, args, profile: pf.Profile, progress) -> dict:
    directory = services_dir(args, "paper") / "scaled"
    mode = study["mode"]
    cap = getattr(args, "sample_wall_s", None) or SAMPLE_WALL_S[mode]
    fixed = args.dilation_value
    if fixed is None:
        chosen = run_part(study, "dilation warm-up", lambda: calibrate(directory / "calibrate", profile, args.sizes,
                                                                       cap, progress)) or {}
    else:
        chosen = {size: {"dilation": fixed, "wanted": fixed, "capped": False, "given": True} for size in args.sizes}
    samples, per_size = [], {}
    for size in args.sizes:
        if size not in chosen:
            continue
        d = chosen[size]["dilation"]
        got = run_part(study, f"transfer {format_bytes(size)}",
                       lambda s=size, d=d: measure(directory / f"s{s}", profile, s, d, args.repeats, progress,
                                                   PACED_WARMUP[mode]))
        if got:
            samples += got["samples"]
            per_size[size] = {"dilation": d, **{k: v for k, v in chosen[size].items() if k != "dilation"},
                              "pacing": got["pacing"],
                              "invalid_kinds": dl.invalid_kinds(got["pacing"])}
    return {"samples": samples, "sizes": per_size, "rows": fidelity_rows(samples, profile)}


# -- claims and page -------------------------------------------------------------------------------------

DEPENDS = {"cpu": ["cpu_copy", "host_to_wire", "nvme_write", "delivery"],
           "triggered": ["nic_put", "nvme_write", "delivery"]}
SEED = pc.SEED


def virtual_ratio(reading: str):
    """A repetition's CPU-centric ÷ triggered virtual time under a reading."""
    return lambda m: m["cpu"]["virtual_s"][reading] / m["triggered"]["virtual_s"][reading]


def worst_deviation(samples: Sequence[dict], rows: Sequence[dict], reading: str) -> list[float]:
    """Per repetition, the largest |testbed ÷ model - 1| over the sizes and both paths (virtual time; the
    model's times from the fidelity rows)."""
    model = {(r["bytes"], m): r[f"{m}_model_s"] for r in rows if r["reading"] == reading for m in MODES}
    worst: dict[int, float] = {}
    for s in samples:
        got = s["virtual_s"].get(reading)
        if s.get("rep", 0) < 0 or (s["bytes"], s["mode"]) not in model or not got:
            continue
        dev = abs(got / model[(s["bytes"], s["mode"])] - 1)
        worst[s["rep"]] = max(worst.get(s["rep"], 0.0), dev)
    return [worst[r] for r in sorted(worst)]


def _sizes(result: dict) -> list[int]:
    sizes = sorted({r["bytes"] for r in result["rows"]})
    if not sizes:
        raise ValueError("no size measured")
    return sizes


def _speedup_evidence(reading: str, pick: str):
    """Evidence of a speedup claim under a reading: per repetition, the least CPU-centric ÷ triggered in
    virtual time over the sizes `pick` names (fig5: up to 512 MiB; largest; smallest; larger: all but
    the smallest)."""
    def evidence(results) -> Evidence:
        result = results["scaled"]
        sizes = _sizes(result)
        chosen = {"fig5": [s for s in sizes if s <= pc.FIG5_MAX_BYTES] or sizes, "largest": sizes[-1:],
                  "smallest": sizes[:1], "larger": sizes[1:]}[pick]
        if not chosen:
            return Evidence([], "one size measured: no larger sizes")
        xs = pc.per_rep_min(result["samples"], chosen, virtual_ratio(reading))
        return Evidence(xs, f"reading {reading}, virtual time, the least over {pc._span(chosen)}, per "
                            f"repetition: {pc._vals(xs)}")
    return evidence


def _fidelity_evidence(reading: str):
    def evidence(results) -> Evidence:
        result = results["scaled"]
        xs = worst_deviation(result["samples"], result["rows"], reading)
        rows = [r for r in result["rows"] if r["reading"] == reading and r["cpu_ratio"] and r["triggered_ratio"]]
        text = "; ".join(f"{format_bytes(r['bytes'])}: {r['cpu_ratio']:.2f}/{r['triggered_ratio']:.2f}" for r in rows)
        return Evidence(xs, f"testbed ÷ model (CPU-centric/triggered medians) {text or 'none'}; the worst "
                            f"deviation per repetition: {pc._vals([100 * x for x in xs], '%')}")
    return evidence


def _claims(reading: str) -> list[Claim]:
    paper_why = (f"reading {reading} (docs/analytical-model.md); the paper's hardware, modeled by the `paper` "
                 "profile, in virtual time")
    speedup = f"CPU-centric ÷ triggered in virtual time, reading {reading}"
    return [
        Claim(f"fidelity_{reading}", "Figs. 5-7 (scale model)",
              f"the running pipeline under a profile reproduces bench/analytical_model.py, reading {reading}",
              "per repetition, the worst |testbed ÷ model - 1| over the sizes and both paths",
              Test("below", TOLERANCE), _fidelity_evidence(reading), source="hypothesis",
              why="the scale model's own check (docs/scale-model.md): a profile's costs, paced, against its "
                  "equations"),
        Claim(f"fig5_{reading}", "Fig. 5", pc.CLAIMS_BY_KEY["fig5_speedup"].words,
              f"{speedup}: per repetition, the least over the sizes up to 512 MiB",
              Test("above", 20.0, 20.0 * TOLERANCE, "x"), _speedup_evidence(reading, "fig5"),
              seed="more than 20x", profiles=pc.PAPER_HARDWARE, why=paper_why),
        Claim(f"fig6_{reading}", "Fig. 6", pc.CLAIMS_BY_KEY["fig6_speedup"].words,
              f"{speedup}: per repetition, at the largest size measured", Test("above", 19.0, 19.0 * TOLERANCE, "x"),
              _speedup_evidence(reading, "largest"), seed=">19x", profiles=pc.PAPER_HARDWARE,
              why=paper_why + "; Fig. 6's terabytes are not run"),
        Claim(f"fig7_small_{reading}", "Fig. 7", pc.CLAIMS_BY_KEY["fig7_small"].words,
              f"{speedup}: per repetition, at the smallest size", Test("between", (23.0, 23.0), 23.0 * TOLERANCE, "x"),
              _speedup_evidence(reading, "smallest"), seed="23x", profiles=pc.PAPER_HARDWARE, why=paper_why),
        Claim(f"fig7_large_{reading}", "Fig. 7", pc.CLAIMS_BY_KEY["fig7_large"].words,
              f"{speedup}: per repetition, the least over the sizes above the smallest",
              Test("above", 19.0, 19.0 * TOLERANCE, "x"), _speedup_evidence(reading, "larger"), seed=">19x",
              profiles=pc.PAPER_HARDWARE, why=paper_why),
    ]


CLAIMS: list[Claim] = [c for reading in READINGS for c in _claims(reading)]


def body_text(result: dict) -> str:
    rows, sizes = result["rows"], result["sizes"]
    if not rows:
        return ""
    head = ["KV size", "reading", "CPU-centric", "model", "ratio", "triggered", "model", "ratio", "speedup",
            "model speedup"]
    body = [[format_bytes(r["bytes"]), r["reading"], _s(r["cpu_s"]), format_seconds(r["cpu_model_s"]),
             _x(r["cpu_ratio"]), _s(r["triggered_s"]), format_seconds(r["triggered_model_s"]),
             _x(r["triggered_ratio"]), _x(r["speedup"], "x"), f"{r['model_speedup']:.3g}x"] for r in rows]
    d_head = ["KV size", "D", "D wanted", "capped", "operations", "violations", "kinds over 1%"]
    d_body = [[format_bytes(size), f"{s['dilation']:.0f}", f"{s.get('wanted', s['dilation']):.0f}",
               "yes" if s.get("capped") else "no", s["pacing"]["ops"], s["pacing"]["violations"],
               ", ".join(s["invalid_kinds"]) or "none"] for size, s in sorted(sizes.items())]
    return "\n".join([
        "## Fidelity: the testbed in virtual time beside the analytical model", "",
        "Medians of the paced samples, virtual time (wall / D). Ratio: testbed ÷ `bench/analytical_model.py` "
        "(reading nvme_queue: the triggered path without the NVMe write, the CPU-centric path with it).", "",
        base.markdown_table(head, body), "",
        "## Dilation per size", "",
        "D per size from a warm-up at D = 1 (or --dilation). A violation: an operation whose real time "
        "overran D x its modeled time (virtual time is then too long for it); `delivery`: data that reached "
        "the storage node after its sender's modeled link had delivered it.", "",
        base.markdown_table(d_head, d_body), ""])


def _s(v: float | None) -> str:
    return format_seconds(v) if v else "-"


def _x(v: float | None, suffix: str = "") -> str:
    return f"{v:.3g}{suffix}" if v else "-"


def intro_text(profile: pf.Profile) -> str:
    return (__doc__.split("\n\n", 1)[1].strip() + f"\n\nProfile `{profile.name}`: {profile.description} "
            "Times on this page are virtual (wall / D).")
