"""`kvtb study paper --profile`: the two readings' models, the layout in the profile's chunks, the choice
of D per size, the fidelity rows; and a --smoke run under `paper` whose records carry D and the
violations (slow: real services)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from bench import analytical_model as am
from bench.study import paper_scaled as ps
from bench.study.claims import evaluate
from bench.study.paper import KIB, MIB
from kvtb.launch import kvtb_argv
from scale import profile as pf

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_the_readings_differ_only_in_the_triggered_paths_nvme_write():
    a, b = ps.model_times(32 * KIB, "nvme_write"), ps.model_times(32 * KIB, "nvme_queue")
    assert a["cpu"] == b["cpu"] == pytest.approx(3.3295e-3, rel=1e-3)  # Tables II/III, docs/analytical-model.md
    assert a["triggered"] == pytest.approx(3.3291e-3, rel=1e-3)
    # without the NVMe write: lambda_PCIE + 32 KiB x beta_NIC_serial + lambda_network = 1.713 us
    assert b["triggered"] == pytest.approx(3.2e-8 + 32768 * 5.13e-11 + 1.21e-12, rel=1e-9)


def test_a_size_moves_in_the_profiles_chunks():
    chunk = ps.chunk_bytes(pf.load("paper"))
    assert chunk == 512 * MIB
    one = ps.layout_for(512 * MIB, chunk)
    assert (one.num_blocks, one.block_bytes) == (1, 512 * MIB)
    small = ps.layout_for(32 * KIB, chunk)
    assert (small.num_blocks, small.block_tokens) == (1, 1)
    four = ps.layout_for(2048 * MIB, chunk)
    assert four.num_blocks == 4
    with pytest.raises(ValueError):
        ps.layout_for(48 * KIB, chunk)


def test_d_is_the_worst_kind_or_path_with_margins_capped_by_the_samples_wall_time():
    kinds = {"nic_put": {"ops": 3, "worst_ratio": 40.0}, "nvme_write": {"ops": 3, "worst_ratio": 0.2}}
    got = ps.choose_dilation(kinds, [3.0], sample_model_s=0.01, wall_cap_s=20.0)
    assert got["dilation"] == 80.0 and not got["capped"]  # 2 x 40 beats 10 x 3
    got = ps.choose_dilation(kinds, [30.0], sample_model_s=0.01, wall_cap_s=20.0)
    assert got["wanted"] == 300.0 and got["dilation"] == 300.0
    got = ps.choose_dilation(kinds, [30.0], sample_model_s=1.0, wall_cap_s=50.0)
    assert got["capped"] and got["dilation"] == 80.0  # the path wants 300, the cap allows 50, the kinds need 80
    got = ps.choose_dilation(kinds, [30.0], sample_model_s=1.0, wall_cap_s=200.0)
    assert got["capped"] and got["dilation"] == 200.0  # a sample of 1 s virtual may take 200 s of wall
    assert ps.choose_dilation({}, [], 1.0, 20.0)["dilation"] == 1.0


def test_fidelity_rows_are_medians_against_the_model_per_reading():
    size = 32 * KIB
    model = {r: ps.model_times(size, r) for r in ps.READINGS}

    def samples(cpu, trig):
        return [{"bytes": size, "mode": m, "virtual_s": {r: model[r][m] * f for r in ps.READINGS}}
                for m, fs in (("cpu", cpu), ("triggered", trig)) for f in fs]
    rows = {r["reading"]: r for r in ps.fidelity_rows(samples((1.0, 1.1, 1.2), (0.8, 0.84)))}
    assert rows["nvme_write"]["cpu_ratio"] == pytest.approx(1.1)
    assert rows["nvme_write"]["triggered_ratio"] == pytest.approx(0.82)
    assert not rows["nvme_write"]["within"]  # 18% under the model
    rows = {r["reading"]: r for r in ps.fidelity_rows(samples((0.9, 1.1), (0.95, 1.05, 1.14)))}
    assert rows["nvme_queue"]["within"] and rows["nvme_write"]["within"]
    assert rows["nvme_queue"]["speedup"] == pytest.approx(rows["nvme_queue"]["model_speedup"] * 1.0 / 1.05)
    assert rows["nvme_queue"]["model_speedup"] > 1000  # 3.33 ms against 1.7 us


def scaled(speedup, deviation, reps=3, sizes=(32 * KIB, MIB)):
    """Hand-made paced samples: per size and repetition the model's CPU-centric time x (1 + deviation),
    triggered that ÷ speedup, under both readings; and their fidelity rows."""
    samples = []
    for rep in range(reps):
        for size in sizes:
            cpu = {r: ps.model_times(size, r)["cpu"] * (1 + deviation) for r in ps.READINGS}
            samples += [{"bytes": size, "mode": "cpu", "rep": rep, "virtual_s": cpu},
                        {"bytes": size, "mode": "triggered", "rep": rep,
                         "virtual_s": {r: v / speedup for r, v in cpu.items()}}]
    return {"scaled": {"samples": samples, "rows": ps.fidelity_rows(samples), "sizes": {}}}


def test_the_scaled_claims_are_a_table_judged_per_repetition_under_the_paper_profile():
    keys = [c.key for c in ps.CLAIMS]
    assert len(keys) == len(set(keys)) == 5 * len(ps.READINGS)
    assert ps.SEED == "triggered-ops-kv-cache-paper.txt"
    got = {c["key"]: c for c in evaluate(ps.CLAIMS, scaled(21.0, 0.0), "paper")}
    assert got["fig7_large_nvme_queue"]["verdict"] == "agrees"
    assert got["fig7_small_nvme_queue"]["verdict"] == "agrees" and got["fig5_nvme_write"]["verdict"] == "agrees"
    assert len(got["fig6_nvme_write"]["values"]) == 3
    # the triggered path is measured 21x faster than CPU-centric, so its ratio to the model is off by far
    assert got["fidelity_nvme_write"]["verdict"] == "disagrees"
    got = {c["key"]: c for c in evaluate(ps.CLAIMS, scaled(1.05, 0.0), "paper")}
    assert got["fig7_large_nvme_write"]["verdict"] == "disagrees" and got["fig5_nvme_queue"]["verdict"] == "disagrees"
    # the model's own speedup (about 1x under reading nvme_write), 2% off: the fidelity agrees
    model_like = scaled(ps.model_times(32 * KIB, "nvme_write")["cpu"] / ps.model_times(32 * KIB, "nvme_write")["triggered"],
                        0.02, sizes=(32 * KIB,))
    assert evaluate(ps.CLAIMS, model_like, "paper")[0]["verdict"] == "agrees"
    # without the paper's profile its numbers are out of scope; one repetition is inconclusive
    assert {c["key"]: c["verdict"] for c in evaluate(ps.CLAIMS, scaled(21.0, 0.0), "")}["fig5_nvme_write"] == "out of scope"
    one = {c["key"]: c["verdict"] for c in evaluate(ps.CLAIMS, scaled(21.0, 0.0, reps=1), "paper")}
    assert one["fig5_nvme_write"] == "inconclusive"


def test_the_scaled_plots_are_in_virtual_time(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.study import paper_plots
    paths = paper_plots.scaled_plots(tmp_path, scaled(21.0, 0.0)["scaled"])
    assert sorted(p.name for p in paths) == [f"fig5_7_virtual_{r}.png" for r in sorted(ps.READINGS)]


@pytest.mark.slow
def test_smoke_run_under_the_paper_profile_records_d_and_violations(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("study", "paper", "--profile", "paper", "--smoke", "--json", "--out", str(out)),
                          capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(tmp_path)})
    s = json.loads(done.stdout.strip().splitlines()[-1])
    assert s["failed"] == [], s["failed"]
    assert s["scale"]["profile"] == "paper" and s["scale"]["times"] == "virtual (wall / D)"
    sizes = s["results"]["scaled"]["sizes"]
    assert sorted(int(k) for k in sizes) == list(ps.SMOKE_SIZES)
    for per in sizes.values():
        assert per["dilation"] >= 1 and per["pacing"]["ops"] > 0
        assert {"nic_put", "cpu_copy", "nvme_write"} <= set(per["pacing"]["kinds"])
    rows = s["results"]["scaled"]["rows"]
    assert {(r["bytes"], r["reading"]) for r in rows} == {(b, r) for b in ps.SMOKE_SIZES for r in ps.READINGS}
    assert all(r["cpu_ratio"] and r["triggered_ratio"] for r in rows)
    assert {c["key"] for c in s["claims"]} == {c.key for c in ps.CLAIMS}
    assert all(c["measured"] and c["verdict"] for c in s["claims"])
    assert "virtual" in (out / "README.md").read_text()
