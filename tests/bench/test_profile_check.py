"""`kvtb profile check`: the D recommendation, the study estimates and the table by hand; a quick run."""
from __future__ import annotations

import json

import pytest

from bench import profile_check as pc
from scale import ops
from scale import profile as pf


def kinds_of(**needs) -> dict:
    return {k: {"need": v} for k, v in needs.items()}


def test_recommend_is_the_largest_need_times_the_margin():
    assert pc.recommend(kinds_of(gpu_step=40.0, nvme_write=0.2, cpu_copy=3.0), 2.0) == (80.0, "gpu_step")
    assert pc.recommend(kinds_of(gpu_step=40.0), 1.5) == (60.0, "gpu_step")
    assert pc.recommend(kinds_of(swap_out=0.1, nvme_read=0.3), 2.0)[0] == 1.0  # never below real time


def test_kind_summary_takes_the_worst_shape():
    rows = [pc.shape_row("a", 2.0, 1.0, "block"), pc.shape_row("b", 9.0, 1.5), pc.shape_row("c", 1.0, 4.0)]
    k = pc.kind_summary(rows, "how")
    assert (k["real_s"], k["modeled_s"], k["need"], k["worst_shape"]) == (9.0, 1.5, 6.0, "b")
    assert k["shapes"] == rows and rows[0]["need"] == 2.0


def test_transfer_sizes_blocks_and_the_papers_sizes():
    polaris = pc.transfer_sizes(pf.load("polaris-a100"), quick=False)
    assert set(polaris) == set(ops.KINDS) - {"gpu_step"}
    assert polaris["nvme_write"] == [(32 * 46_080, "block")]
    assert polaris["swap_in"] == [(32 * 46_080, "block"), (64 * pc.MIB, None)]
    paper = pf.load("paper")
    full = [n for n, _ in pc.transfer_sizes(paper, False)["cpu_copy"]]
    assert full == [32 * 1024, pc.MIB, 32 * pc.MIB, 512 * pc.MIB]
    quick = pc.transfer_sizes(paper, True)["nic_put"]
    assert quick == [(32 * 1024, None), (pc.MIB, "block"), (32 * pc.MIB, None)]


def hand_kinds() -> dict:
    step = [pc.shape_row("decode, batch 32", 0.5, 0.1, "decode b32"),
            pc.shape_row("prefill", 2.0, 0.05, "prefill")]
    nvme = [pc.shape_row("block", 0.002, 0.004, "block")]
    return {"gpu_step": pc.kind_summary(step, "step"), "nvme_write": pc.kind_summary(nvme, "file")}


WORK = {"paper": (4.0, "bytes"), "poster": (3.0, "tokens"), "scalellm": (10.0, "requests"),
        "eviction": (5.0, "requests")}


def test_study_estimates_by_hand():
    recorded = {"poster": {"elapsed_s": 100.0, "mode": "quick", "transfers_s": 0.0},
                "scalellm": {"elapsed_s": 300.0, "mode": "full", "transfers_s": 0.0},  # full: / 10 as quick
                "eviction": {"elapsed_s": 50.0, "mode": "quick", "transfers_s": 0.0},
                "paper": {"elapsed_s": 80.0, "mode": "quick", "transfers_s": 50.0}}
    est = pc.study_estimates(hand_kinds(), 20.0, recorded, WORK, {"quick": 2.0, "full": 10.0})
    # poster: decode b32 paced 20 x 0.1 / 0.5 = 4x its real time; full does 3x the work
    assert est["poster"]["paced_over_real"] == pytest.approx(4.0)
    assert est["poster"]["quick"]["estimate_s"] == pytest.approx(400.0)
    assert est["poster"]["full"]["estimate_s"] == pytest.approx(1200.0)
    assert "100 s" in est["poster"]["quick"]["basis"] and "x 4" in est["poster"]["quick"]["basis"]
    assert est["scalellm"]["quick"]["estimate_s"] == pytest.approx(120.0)   # 300 / 10 x 4
    assert est["scalellm"]["full"]["estimate_s"] == pytest.approx(1200.0)
    # eviction: prefill 20 x 0.05 / 2 = 0.5: pacing never makes it faster than real
    assert est["eviction"]["paced_over_real"] == 1.0
    assert est["eviction"]["quick"]["estimate_s"] == pytest.approx(50.0)
    # paper: the profiled study's own estimate of its wall time (given here by mode)
    assert est["paper"]["quick"]["estimate_s"] == pytest.approx(2.0)
    assert est["paper"]["full"]["estimate_s"] == pytest.approx(10.0)
    assert "D x its modeled time" in est["paper"]["full"]["basis"]


def test_study_estimates_without_a_pace_or_a_record():
    est = pc.study_estimates({"nvme_write": hand_kinds()["nvme_write"]}, 10.0,
                             {"poster": {"elapsed_s": 100.0, "mode": "quick"}}, WORK)
    assert est["poster"]["quick"]["estimate_s"] == 100.0  # gpu_step not paced under the profile: real time
    assert "not paced" in est["poster"]["quick"]["basis"]
    none = est["scalellm"]["full"]
    assert none["estimate_s"] is None and "results.json" in none["basis"]


def test_the_paper_studys_wall_estimate_by_hand():
    from bench.study import paper_scaled as ps
    p = pf.load("paper")
    model = ps.model_times(32 * 1024, "nvme_write", p)  # 3.33 ms each path
    want = ps.SCALED_REPEATS["quick"] * sum(100 * t for t in model.values()) + 2 * ps.RIG_START_S
    assert ps.estimate_wall_s([32 * 1024], "quick", 100.0, p) == pytest.approx(want)
    # full mode: a paced warm-up and three samples of each path
    full = ps.estimate_wall_s([32 * 1024], "full", 100.0, p)
    assert full == pytest.approx(4 * sum(100 * t for t in model.values()) + 2 * ps.RIG_START_S)


def test_work_ratios_from_the_studies_settings():
    work = pc.work_ratios(2 * 1024 ** 3)
    assert work["eviction"][0] == pytest.approx(60 * 2 / (25 * 1))  # eviction.REAL_REQUESTS x policies
    assert work["scalellm"][0] == pytest.approx(511 * 3 * 512 / (85 * 2 * 32))  # levels x requests x tokens
    assert work["paper"][0] > 1 and work["poster"][0] > 1


def test_table_by_hand():
    kinds = hand_kinds()
    studies = pc.study_estimates(kinds, 80.0, {"poster": {"elapsed_s": 60.0, "mode": "quick"}}, WORK)
    report = {"profile": "x", "kv_scale": 11.38, "repeats": 3, "step_model": "a TINY model", "margin": 2.0,
              "kinds": kinds, "dilation": 80.0, "dilation_set_by": "gpu_step", "notes": ["a proxy"],
              "studies": studies}
    text = pc.table(report)
    assert "recommended D: 80 (gpu_step needs 40, x margin 2)" in text
    lines = text.splitlines()
    assert any(line.split()[:1] == ["gpu_step"] and "500 ms" in line and "100 ms" in line for line in lines)
    assert any(line.startswith("poster") and "16 min" in line for line in lines)  # 60 s x 80 x 0.1 / 0.5
    assert "estimates" in text and "note: a proxy" in text
    assert pc.duration(90) == "1.5 min" and pc.duration(7200) == "2 h" and pc.duration(None) == "-"


def test_quick_run_reports_every_kind(capsys):
    assert pc.main(["polaris-a100", "--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["kinds"]) == set(ops.KINDS)
    for kind, k in report["kinds"].items():
        assert k["real_s"] > 0 and k["modeled_s"] > 0 and k["need"] > 0, kind
    assert report["dilation"] >= 1 and "TINY" in report["step_model"]
    assert report["kv_scale"] == pytest.approx(32 * 2 * 32 * 128 * 2 / 46_080)
    assert set(report["studies"]) == {"paper", "poster", "scalellm", "eviction"}
    assert all("basis" in e["quick"] and "basis" in e["full"] for e in report["studies"].values())


def test_unknown_profile_exits_2(capsys):
    assert pc.main(["no-such-profile"]) == 2
    assert "no hardware profile 'no-such-profile'" in capsys.readouterr().err


def test_the_command_is_listed():
    from kvtb.cli import COMMANDS, _group_usage
    assert COMMANDS[("profile", "check")] == "bench.profile_check:main"
    assert "profile check" in _group_usage("profile")
