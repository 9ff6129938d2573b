"""kvtb study poster: the overhead definitions (pure), the plan, and a --smoke run's JSON contract (slow: real
services, the tiny model). The claims from hand-made results: test_poster_claims.py."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.study import overhead as ov
from bench.study import poster
from bench.study.claims import VERDICTS
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


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


def test_the_plan_runs_each_point_once_and_counts_every_repeat():
    m = poster.MODES["quick"]
    points = poster.planned(m)
    assert len(points) == len({(w, b, s) for w, b, s, _ in points}) == len(poster.plan(m))
    baselines = {}
    for w, b, _, strategies in points:
        baselines.setdefault((w, b), set()).update(poster.STRATEGIES[s][1] for s in strategies)
    batches = sum(len(s) for *_, s in points) + sum(len(p) for p in baselines.values())
    assert poster.count_runs(m) == m.repeats * batches


def test_quick_and_full_repeat_three_times_and_run_the_posters_12_percent():
    for name in ("quick", "full"):
        m = poster.MODES[name]
        assert m.repeats >= 3 and 0.12 in m.shares
    assert poster.MODES["smoke"].repeats == 1
    # quick keeps to the budget by points, not repeats: Figs 2 and 4 run the poster's two strategies
    assert poster.MODES["quick"].side_strategies == ("recompute", "swap-host")
    assert poster.count_runs(poster.MODES["quick"]) <= 45


# -- the whole study, smoke --------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_cut_keeps_full_workloads_at_fewer_points_and_shares_on_both_sides_of_30_to_50():
    full, cut = poster.MODES["full"], poster.MODES["cut"]
    assert cut.fig5 == full.fig5 and cut.repeats == full.repeats == 3
    assert poster.count_runs(cut) < poster.count_runs(full)
    assert min(cut.shares) < 0.3 and max(cut.shares) > 0.5 and 0.12 in cut.shares
    assert poster.parse_args(["--cut"]).cut
    with pytest.raises(SystemExit):
        poster.parse_args(["--cut", "--quick"])


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
    assert all(c["verdict"] in VERDICTS for c in result["claims"])
    assert {c["key"] for c in result["claims"]} == {c.key for c in poster.CLAIMS}
    # one repeat in smoke mode: nothing can agree or disagree
    assert not any(c["verdict"] in ("agrees", "disagrees") for c in result["claims"])
    assert result["settings"]["prefix_cache"] is False
    assert result["ratios"]
    assert result["plots"] and all(Path(p).exists() for p in result["plots"])
    assert (out / "README.md").exists() and (out / "results.json").exists()
    tight = result["results"]["fig5"]
    assert any(r["preemption_count"] for by in tight.values() for r in by.values())
    # the prefix cache is off: nothing evicted is found again, the recompute recomputes it all
    assert all(rep["reused_tokens"] == 0 for by in tight.values() for r in by.values() for rep in r["repeats"])

    # a second sitting (--resume) after a stop that lost the last point: only that point runs again
    journal = json.loads((out / "journal.json").read_text())
    assert len(journal["sittings"]) == 1 and journal["sittings"][0]["points"] == len(journal["points"])
    lost = journal["points"].pop()
    journal["sittings"][0]["points"] -= 1
    (out / "journal.json").write_text(json.dumps(journal))
    proc = subprocess.run(kvtb_argv("study", "poster", "--smoke", "--json", "--out", str(out), "--resume"),
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert again["failed"] == [] and [s["points"] for s in again["settings"]["sittings"]] == [len(journal["points"]), 1]
    assert "## Sittings" in (out / "README.md").read_text()
    kept = {json.dumps(p["key"]) for p in journal["points"]}
    for fig in ("fig2", "fig4", "fig5"):  # the kept points are the first sitting's, to the byte
        for x, by in result["results"][fig].items():
            for s, r in by.items():
                key = json.dumps(["point", [int(v) for v in r["workload"].replace("+", "x").split("x")],
                                  r["block_tokens"], r["share"], s])
                assert (again["results"][fig][x][s] == r) == (key in kept), (fig, x, s, lost["key"])


@pytest.mark.slow
def test_smoke_run_under_a_profile_is_in_virtual_time_with_d_and_violations(tmp_path):
    out = tmp_path / "out"
    # as a user runs it: no credentials directory given, the stack makes its own
    env = {k: v for k, v in os.environ.items() if k != "KVTB_CREDENTIALS_DIR"} | {"HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(kvtb_argv("study", "poster", "--smoke", "--json", "--out", str(out),
                                    "--profile", "polaris-a100", "--dilation", "3"),
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    scale = result["scale"]
    assert scale["profile"] == "polaris-a100" and scale["dilation"] == 3.0 and scale["dilation_chosen"] == "given"
    kinds = scale["pacing"]["kinds"]
    assert kinds["gpu_step"]["ops"] > 0 and "violations" in kinds["gpu_step"]
    # the storage node's pacer is read too, with the run's own credentials: its NVMe writes are counted
    assert kinds.get("nvme_write", {}).get("ops", 0) > 0, kinds
    assert "pacing stats:" not in proc.stderr
    assert result["settings"]["profile"] == "polaris-a100"
    assert result["claims"] and all(c["verdict"] in VERDICTS for c in result["claims"])
    page = (out / "README.md").read_text()
    assert "times are virtual (wall / D), D = 3" in page and "Under the hardware profile `polaris-a100`" in page
