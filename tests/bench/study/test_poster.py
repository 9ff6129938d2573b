"""kvtb study poster: the overhead definitions (pure), the claims from hand-made rows, and a --smoke run's
JSON contract (slow: real services, the tiny model)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.study import overhead as ov
from bench.study import poster
from kvtb.launch import kvtb_argv


# -- the overhead definitions ------------------------------------------------------------------------------

def test_need_is_every_request_at_its_longest_in_whole_blocks():
    # 100 + 50 tokens: the KV covers 149 (the last token generated has none): 10 blocks of 16
    assert ov.need_tokens(32, 100, 50, 16) == 32 * 10 * 16
    with pytest.raises(ValueError):
        ov.need_tokens(0, 100, 50, 16)


def test_a_share_of_the_need_is_whole_blocks_and_never_below_one_request():
    need = ov.need_tokens(16, 64, 32, 16)  # 16 x 6 blocks
    assert ov.pool_for_share(0.5, 16, 64, 32, 16) == need // 2
    assert ov.pool_for_share(0.3, 16, 64, 32, 16) % 16 == 0
    assert ov.pool_for_share(0.01, 16, 64, 32, 16) == (6 + 1) * 16  # one request and a block
    with pytest.raises(ValueError):
        ov.pool_for_share(0, 16, 64, 32, 16)


def test_extra_end_to_end_is_against_the_ample_run():
    assert ov.extra_e2e(12.0, 10.0) == {"extra_e2e_s": 2.0, "extra_e2e_frac": 0.2}
    assert ov.extra_e2e(9.0, 10.0)["extra_e2e_s"] == -1.0  # noise can make it negative: reported as is
    with pytest.raises(ValueError):
        ov.extra_e2e(1.0, 0.0)


def test_the_engines_overhead_is_recompute_plus_swap_and_its_blocking_part_leaves_the_waits_out():
    before = {"preempt_recompute_s": 1.0, "preempt_swap_s": 0.5, "preempt_swap_out_s": 0.1}
    after = {"preempt_recompute_s": 3.0, "preempt_swap_s": 2.5, "preempt_swap_out_s": 0.3, "preempt_swap_in_s": 0.2,
             "preempt_swap_wait_s": 1.5}
    delta = ov.counter_delta(before, after)
    assert delta["preempt_recompute_s"] == 2.0 and delta["preempt_swap_wait_s"] == 1.5
    got = ov.engine_overhead(delta)
    assert got["engine_recompute_s"] == 2.0 and got["engine_swap_s"] == 2.0 and got["engine_total_s"] == 4.0
    assert got["engine_blocking_s"] == pytest.approx(2.0 + 0.2 + 0.2)


def test_cpu_time_is_the_serving_processes_and_its_extra_is_against_the_ample_run():
    before = {"compute": 10.0, "smartnic": 1.0, "storage-0": 0.5, "frontend": 3.0, "client": 9.0}
    after = {"compute": 25.0, "smartnic": 2.0, "storage-0": 1.5, "frontend": 9.0, "client": 99.0}
    assert ov.cpu_delta(before, after) == pytest.approx(17.0)  # neither the frontend nor the client
    assert ov.extra_cpu(12.0, 8.0) == {"extra_cpu_s": 4.0, "extra_cpu_frac": 0.5}
    with pytest.raises(ValueError):
        ov.extra_cpu(1.0, 0.0)


def test_throughput_bins_count_tokens_per_second():
    series = ov.throughput_series([0.1, 0.2, 0.3, 0.6, 1.2], 0.0, 1.25, 0.5)
    assert series == [(0.0, 6.0), (0.5, 2.0), (1.0, 2.0)]


def test_rebinning_averages_the_rate():
    assert ov.rebin([(0.0, 4.0), (0.25, 0.0), (0.5, 8.0), (0.75, 0.0), (1.0, 2.0)], 4) == [(0.0, 3.0), (1.0, 2.0)]


def test_usage_swings_count_drops_and_rises():
    assert ov.usage_swings([0.1, 0.5, 0.9, 0.6, 0.6, 0.95, 0.2]) == {"drops": 2, "rises": 3, "peak": 0.95}


def test_trend_by_rank_correlation():
    assert ov.trend([8, 16, 32, 64], [4.0, 3.0, 2.5, 1.0]) == "down"
    assert ov.trend([1, 2, 3], [1.0, 2.0, 3.0]) == "up"
    assert ov.trend([1, 2, 3, 4], [1.0, 3.0, 1.0, 3.0]) == "flat/mixed"
    assert ov.trend([1, 2], [2.0, 1.0]) == "down"
    assert ov.spearman([1, 2], [1, 2]) is None


# -- claims from hand-made rows --------------------------------------------------------------------------

def _row(strategy, extra, engine, evicted, ample=10.0, share=0.2):
    return {"strategy": strategy, "extra_e2e_s": extra, "extra_e2e_frac": extra / ample, "engine_total_s": engine,
            "extra_cpu_s": extra, "extra_cpu_frac": extra / ample, "ample_cpu_s": ample,
            "evicted_tokens": evicted, "ample_makespan_s": ample, "actual_share": share, "workload": "16x64+32",
            "preemptions": {"x": 3}, "counters": {"preempt_swap_out_s": 0.01, "preempt_swap_wait_s": 0.5,
                                                   "preempt_swap_in_s": 0.01, "swap_host_bytes_out": 2**20},
            "usage": [(0.0, 0.2), (0.25, 0.9), (0.5, 0.5), (0.75, 0.9)], "throughput": [(0.0, 10.0), (0.25, 40.0)]}


def test_every_claim_of_figs_2_to_6_gets_a_measurement_and_a_verdict():
    by = lambda rec, host, st, ev=(100, 100, 100): {  # noqa: E731
        "recompute": _row("recompute", rec, rec / 2, ev[0]), "swap-host": _row("swap-host", host, host / 20, ev[1]),
        "swap-storage": _row("swap-storage", st, st / 5, ev[2])}
    study = {"results": {"fig2": {"16": by(3.0, 2.0, 2.5), "64": by(3.1, 1.0, 1.5)},
                         "fig4": {"48": by(1.0, 0.5, 0.7), "96": by(3.0, 1.0, 2.0)},
                         "fig5": {"0.2": by(4.0, 2.0, 3.0, (900, 900, 900)), "0.45": by(1.0, 0.5, 0.5, (200, 200, 200))}},
             "claims": [], "failed": [], "ratios": {}}
    study["results"]["fig6"] = poster.fig6(study["results"])
    poster.add_claims(study)
    figures = {c["figure"] for c in study["claims"]}
    assert figures == {"Fig. 2", "Fig. 3", "Fig. 4", "Fig. 5", "Fig. 6"}
    assert all(c["measured"] for c in study["claims"])
    verdict = {c["claim"]: c["agrees"] for c in study["claims"]}
    assert verdict["Recompute: block size has minimal effect on its overhead"] is True
    assert verdict["Swap has lower overhead when more tokens are evicted in an overflow"] is True
    assert verdict["Swap performs better than recompute for long sequences (lower overhead)"] is True
    assert verdict["The overhead increases with increasing the sequence length"] is True
    poster.add_ratios(study)
    assert study["ratios"]["recompute_vs_swap_host_extra_e2e_at_0.2"] == pytest.approx(2.0)
    rows = poster.headline_rows(study)
    assert 1 <= len(rows) <= 3 and all(set(r) == {"question", "measured", "target"} for r in rows)
    assert "+4.0 s" in rows[0]["measured"]


def test_a_failed_study_still_gives_headline_rows_and_claims():
    study = {"results": {}, "claims": [], "failed": [{"part": "fig5", "error": "boom"}], "ratios": {}}
    poster.add_claims(study)
    assert study["claims"] and all(c["measured"] for c in study["claims"])
    assert "failed: boom" in poster.headline_rows(study)[0]["measured"]


def test_the_plan_runs_each_point_once():
    m = poster.MODES["quick"]
    plan = poster.plan(m)
    assert len(plan) == len(set(plan))
    assert poster.count_runs(m) == len(plan) * 3 + 2 * len({(w, b) for w, b, _ in plan})


# -- the whole study, smoke --------------------------------------------------------------------------------

@pytest.mark.slow
def test_smoke_run_keeps_the_json_contract(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(kvtb_argv("study", "poster", "--smoke", "--json", "--out", str(out)),
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("study", "machine", "settings", "results", "claims", "ratios", "plots"):
        assert key in result, key
    assert result["study"] == "poster" and result["failed"] == []
    assert result["claims"] and all(c["measured"] for c in result["claims"])
    assert {c["figure"] for c in result["claims"]} >= {"Fig. 2", "Fig. 3", "Fig. 4", "Fig. 5", "Fig. 6"}
    assert result["ratios"]
    assert result["plots"] and all(Path(p).exists() for p in result["plots"])
    assert (out / "README.md").exists() and (out / "results.json").exists()
    tight = result["results"]["fig5"]
    assert any(sum(r["preemptions"].values()) for by in tight.values() for r in by.values())


@pytest.mark.slow
def test_smoke_run_under_a_profile_is_in_virtual_time_with_d_and_violations(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(kvtb_argv("study", "poster", "--smoke", "--json", "--out", str(out),
                                    "--profile", "polaris-a100", "--dilation", "3"),
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    scale = result["scale"]
    assert scale["profile"] == "polaris-a100" and scale["dilation"] == 3.0 and scale["dilation_chosen"] == "given"
    kinds = scale["pacing"]["kinds"]
    assert kinds["gpu_step"]["ops"] > 0 and "violations" in kinds["gpu_step"]
    assert result["settings"]["profile"] == "polaris-a100"
    assert result["claims"] and all(c["agrees"] in (True, False, None, "invalid") for c in result["claims"])
    page = (out / "README.md").read_text()
    assert "times are virtual (wall / D), D = 3" in page and "Under the hardware profile `polaris-a100`" in page
