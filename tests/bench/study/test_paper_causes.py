"""The paper study's causes part: Fig. 1's arithmetic, the claims' evidence on hand-made results (each
claim can come out agrees and disagrees), the headline row; and a smoke run of measure() (slow: real
services, the tiny model)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.study import paper_causes, paper_decode, paper_get, paper_kv_size, paper_latency
from bench.study.claims import VERDICTS, evaluate

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

MIB = 1 << 20
PAPERS = Path("/work/shared/papers")


# -- Fig. 1 by arithmetic ----------------------------------------------------------------------------------

def test_kv_bytes_per_token_is_k_and_v_of_every_layer_and_kv_head():
    by = {m.name: m for m in paper_kv_size.MODELS}
    assert by["Llama-2-7B"].kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert by["Llama-2-70B"].kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2  # grouped-query: 8 KV heads
    rows = {r["model"]: r for r in paper_kv_size.fig1_rows()}
    seven = rows["Llama-2-7B"]
    assert seven["kv_bytes"] == 512 * 1024 * 512 * 64  # 512 tokens x batch 64: 16 GiB
    assert seven["kv_over_model"] == pytest.approx(seven["kv_bytes"] / (6.74e9 * 2))
    assert seven["kv_over_model"] > 1 > rows["Llama-2-70B"]["kv_over_model"]


# -- the seed's words --------------------------------------------------------------------------------------

def test_every_seed_claim_quotes_the_seed_exactly():
    text = re.sub(r"\s+", " ", (PAPERS / paper_causes.SEED).read_text())
    for c in paper_causes.CLAIMS:
        if c.source == "seed":
            assert re.sub(r"\s+", " ", c.words) in text, c.key


# -- hand-made results -------------------------------------------------------------------------------------

def decode(tbt: dict[str, float], compute_cpu: dict[str, float], rounds: int = 3) -> dict:
    samples = []
    for r in range(rounds):
        for p in ("resident", "triggered", "cpu"):
            jitter = 1 + 0.002 * r
            samples.append({"policy": p, "round": r, "tbt_ms": tbt[p] * jitter, "bytes": 0 if p == "resident" else 1e8,
                            "blocks": 0 if p == "resident" else 100, "stall_ms": 0.0,
                            "cpu_s": {"compute": compute_cpu[p] * jitter, "smartnic": 0.1, "storage": 0.1}})
    return {"samples": samples, "decode_tokens": 96, "block_tokens": 8, "prompt_tokens": 20, "repeats": rounds,
            "policies": ["resident", "triggered", "cpu"], "model": "test"}


def transfers(e2e: dict[tuple[str, str], float], cpu: dict[str, tuple[float, float, float]], reps: int = 3) -> dict:
    """e2e[(mode, direction)] seconds at 32 MiB; cpu[mode] = (compute, agent, storage) seconds of a PUT."""
    samples = []
    for size in (MIB, 32 * MIB):
        scale = size / (32 * MIB)
        for rep in range(-1, reps):
            for mode in ("cpu", "triggered"):
                for direction in ("put", "get"):
                    compute, agent, storage = cpu[mode]
                    samples.append({"mode": mode, "direction": direction, "rep": rep, "bytes": size,
                                    "blocks": size // MIB, "e2e_s": e2e[mode, direction] * scale * (1 + 0.01 * rep),
                                    "compute_cpu_s": compute * scale, "agent_cpu_s": agent * scale,
                                    "storage_cpu_s": storage * scale})
    return {"samples": samples, "sizes": [MIB, 32 * MIB], "repeats": reps}


def latency(small_read_s: float, big_read_s: float, write_per_byte: dict[int, float], node_factor: float,
            reps: int = 3) -> dict:
    sizes = (512, 4096, 2 * MIB, 16 * MIB, 128 * MIB)
    samples = []
    for rep in range(reps):
        for size in sizes:
            read = small_read_s if size <= 256 * 1024 else big_read_s * size / (128 * MIB)
            write = write_per_byte.get(size, write_per_byte[16 * MIB]) * size * (1 + 0.01 * rep)
            for path, seconds in (("raw_read", read * (1 + 0.01 * rep)), ("raw_read_cached", read / 10),
                                  ("raw_write", write), ("node_store", write * node_factor),
                                  ("node_retrieve", read)):
                samples.append({"path": path, "bytes": size, "rep": rep, "seconds": seconds, "ops": 1})
    return {"samples": samples, "sizes": list(sizes), "repeats": reps}


def results(good: bool, kv_rows: list[dict] | None = None) -> dict:
    """Every measured claim on the seed's side (good) or against it."""
    if good:
        d = decode({"resident": 20.0, "triggered": 20.2, "cpu": 26.0},
                   {"resident": 10.0, "triggered": 10.01, "cpu": 10.5})
        t = transfers({("cpu", "put"): 2.0, ("triggered", "put"): 0.08, ("cpu", "get"): 1.0,
                       ("triggered", "get"): 0.04}, {"cpu": (1.0, 0.01, 0.1), "triggered": (0.01, 0.05, 0.1)})
        lat = latency(0.05, 2.0, {16 * MIB: 1e-9, 128 * MIB: 3e-9}, 1.2)
    else:
        d = decode({"resident": 20.0, "triggered": 30.0, "cpu": 24.0},
                   {"resident": 10.0, "triggered": 11.0, "cpu": 10.5})
        t = transfers({("cpu", "put"): 1.0, ("triggered", "put"): 0.9, ("cpu", "get"): 0.5,
                       ("triggered", "get"): 0.6}, {"cpu": (0.5, 0.01, 0.1), "triggered": (0.3, 0.5, 0.1)})
        lat = latency(0.0002, 0.2, {16 * MIB: 1e-9, 128 * MIB: 0.8e-9}, 3.0)
    kv = paper_kv_size.measure()
    if kv_rows is not None:
        kv["rows"] = kv_rows
    return {"causes": {"mode": "quick", "failed": {}, "part_seconds": {}, "decode": d, "transfers": t,
                       "latency": lat, "kv_size": kv}}


def verdicts(res: dict, profile: str = "paper") -> dict[str, str]:
    return {r["key"]: r["verdict"] for r in evaluate(paper_causes.CLAIMS, res, profile)}


FIG1 = {"fig1_kv_exceeds_model", "fig1_kv_significant"}


def test_each_claim_agrees_on_results_on_the_seeds_side():
    got = verdicts(results(good=True))
    assert got == {key: "agrees" for key in got}, got


def test_each_claim_disagrees_on_results_against_the_seed():
    small = [dict(r, kv_over_model=0.01) for r in paper_kv_size.fig1_rows()]
    got = verdicts(results(good=False, kv_rows=small))
    assert got == {key: "disagrees" for key in got}, got


def test_claims_about_the_seeds_hardware_are_out_of_scope_without_its_profile():
    got = verdicts(results(good=True), profile="")
    assert got["fig4_small_read"] == got["sec1_retrieval_19x"] == "out of scope"
    assert got["sec2c_decode_cpu_over_triggered"] == "agrees"


def test_one_repeat_is_inconclusive_and_a_failed_part_is_not_measured():
    res = results(good=True)
    c = res["causes"]
    c["decode"] = decode({"resident": 20.0, "triggered": 20.0, "cpu": 30.0},
                         {"resident": 1.0, "triggered": 1.0, "cpu": 2.0}, rounds=1)
    del c["transfers"]
    c["failed"]["transfers"] = "RuntimeError: no storage node"
    records = {r["key"]: r for r in evaluate(paper_causes.CLAIMS, res, "paper")}
    assert records["sec2c_decode_cpu_over_triggered"]["verdict"] == "inconclusive"
    assert records["sec1_host_cpu_per_gb"]["verdict"] == "not measured"
    assert "no storage node" in records["sec1_host_cpu_per_gb"]["measured"]
    assert records["fig1_kv_exceeds_model"]["verdict"] == "agrees"  # arithmetic: one value suffices


def test_a_quick_run_without_128_mib_leaves_the_large_read_not_measured():
    res = results(good=True)
    lat = res["causes"]["latency"]
    lat["samples"] = [s for s in lat["samples"] if s["bytes"] <= 16 * MIB]
    assert verdicts(res)["fig4_large_read"] == "not measured"


# -- the pure helpers ------------------------------------------------------------------------------------

def test_decode_helpers():
    assert paper_decode.serving_cpu({"compute": 1.0, "smartnic": 2.0, "storage-0": 3.0, "storage-1": 1.0,
                                     "frontend": 9.0, "client": 9.0}) == {"compute": 1.0, "smartnic": 2.0,
                                                                          "storage": 4.0}
    base = {"bytes": 0, "cpu_s": {"compute": 1.0}}
    assert paper_decode.offload_cpu_s_per_gb({"bytes": 5e8, "cpu_s": {"compute": 2.0}}, base) == pytest.approx(2.0)
    assert paper_decode.offload_cpu_s_per_gb(base, base) is None
    rounds = paper_decode.by_round(decode({"resident": 10, "triggered": 10, "cpu": 15}, {p: 1 for p in
                                                                                       ("resident", "triggered", "cpu")})["samples"])
    assert paper_decode.tbt_ratio(rounds, "cpu", "triggered") == pytest.approx([1.5] * 3)


def test_sizes_and_steps():
    L = paper_get.layout_for_size(8 * MIB)
    assert (L.num_blocks, L.block_bytes) == (8, MIB)
    with pytest.raises(ValueError):
        paper_get.layout_for_size(48 * 1024)
    assert paper_latency.FIG4_SIZES[0] == 512 and paper_latency.FIG4_SIZES[-1] == 128 * MIB
    assert max(paper_latency.SIZES["full"]) == 128 * MIB and max(paper_latency.SIZES["quick"]) == 32 * MIB
    assert paper_latency.ops_for(512) > 1 == paper_latency.ops_for(2 * MIB)
    assert paper_causes.steps("quick") == (1 + 3) + 3 * 5 + 5  # decode: warm-up and 3 rounds
    with pytest.raises(ValueError):
        paper_causes.measure(Path("/nonexistent"), "slow", None)


def test_headline_row():
    rows = paper_causes.headline_rows(results(good=True))
    assert len(rows) == 1 and set(rows[0]) == {"question", "measured", "target", "claim"}
    assert rows[0]["claim"] in {c.key for c in paper_causes.CLAIMS}
    assert "20.2 ms beside triggered vs 26.1 ms beside CPU-centric" in rows[0]["measured"]
    assert "s/GB triggered" in rows[0]["measured"]
    failed = paper_causes.headline_rows({"causes": {"failed": {"decode": "TimeoutError: x"}}})
    assert failed[0]["measured"] == "failed: TimeoutError: x"


# -- measure(), smoke ------------------------------------------------------------------------------------

class Steps:
    def __init__(self):
        self.done = 0

    def update(self, steps: int = 1, note: str = "") -> None:
        self.done += steps


@pytest.mark.slow
def test_smoke_measure_keeps_the_json_shape(tmp_path):
    progress = Steps()
    got = paper_causes.measure(tmp_path, "smoke", progress)
    json.dumps(got)  # the study writes it as JSON
    assert got["failed"] == {} and progress.done == paper_causes.steps("smoke")
    assert {"decode", "transfers", "latency", "kv_size"} <= set(got)
    assert {s["policy"] for s in got["decode"]["samples"]} == {"resident", "triggered", "cpu"}
    assert all(s["tbt_ms"] > 0 and set(s["cpu_s"]) == {"compute", "smartnic", "storage"}
               for s in got["decode"]["samples"])
    modes = {(s["mode"], s["direction"]) for s in got["transfers"]["samples"]}
    assert modes == {(m, d) for m in ("cpu", "triggered") for d in ("put", "get")}
    assert {s["path"] for s in got["latency"]["samples"]} == set(paper_latency.PATHS)
    records = evaluate(paper_causes.CLAIMS, {"causes": got})
    assert len(records) == len(paper_causes.CLAIMS)
    assert all(r["verdict"] in VERDICTS and r["measured"] for r in records)
    maybe = {"fig4_large_read", "decode_host_cpu_per_gb"}  # quick/smoke stop at 32 MiB; the decode's noise
    assert all(r["verdict"] != "not measured" for r in records if r["key"] not in maybe)
