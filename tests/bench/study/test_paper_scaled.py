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
from bench.study.paper import KIB, MIB
from kvtb.launch import kvtb_argv
from scale import profile as pf


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
    assert any(c["figure"] == "Figs. 5-7 (scale model)" for c in s["claims"])
    assert "virtual" in (out / "README.md").read_text()
