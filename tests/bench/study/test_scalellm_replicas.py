"""`kvtb study scalellm --replicas 1 2`: Fig. 8's ratios, claims, table and intro on hand-made levels, the
options, and a --smoke run with two replica counts (slow: real services, the tiny model)."""
from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from bench.study import scalellm
from bench.study.scalellm_replicas import (
    add_replica_ratios,
    counts_levels,
    placements_text,
    replica_table,
    replicas_text,
)
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def level(tps, ttft_p50, e2e_p50, timeouts=0, generated=None):
    return {"requests": 20, "completed": 20 - timeouts, "timeouts": timeouts, "errors": 0,
            "ttft_ms": {"n": 20, "p50": ttft_p50 * 0.9, "p99": ttft_p50 * 2},
            "ttft_ms_incl_timeouts": {"n": 20, "p50": ttft_p50, "p99": ttft_p50 * 2},
            "e2e_ms": {"n": 20, "p50": e2e_p50, "p99": e2e_p50 * 2, "max": e2e_p50 * 3},
            "output_tokens_per_s": tps, "generated_tokens_per_s": generated}


def study_of(by: dict, failed: list | None = None, replicas=(1, 2)) -> dict:
    return {"study": "scalellm", "machine": {"cores": 2},
            "settings": {"levels": [1, 4, 16], "replicas": list(replicas), "routing": "least_loaded"},
            "results": {"by_replicas": {str(n): {"levels": levels} for n, levels in by.items()}},
            "claims": [], "ratios": {}, "plots": [], "failed": failed or []}


ONE = {"1": level(10.0, 200.0, 3000.0), "4": level(30.0, 400.0, 4000.0),
       "16": level(40.0, 2000.0, 12000.0, timeouts=2, generated=44.0)}
TWO = {"1": level(7.0, 300.0, 4200.0), "4": level(30.0, 380.0, 4100.0),
       "16": {**level(60.0, 1000.0, 8000.0, generated=66.0), "by_replica": {"replica-1": 11, "replica-0": 9}}}


def test_ratios_are_two_replicas_over_one_at_each_level():
    study = study_of({1: ONE, 2: TWO})
    add_replica_ratios(study)
    r = study["ratios"]
    assert r["tokens_per_s_2r_vs_1r_at_1"] == pytest.approx(0.7)
    assert r["tokens_per_s_2r_vs_1r_at_16"] == pytest.approx(1.5)           # the generated tokens/s
    assert r["ttft_p50_2r_vs_1r_at_16"] == pytest.approx(0.5)               # timed-out requests included
    assert r["e2e_p50_2r_vs_1r_at_4"] == pytest.approx(4100 / 4000)
    assert not any(k.startswith("tokens_per_s_1r") for k in r)


def with_repeats(levels: dict, factors=(1.0, 1.02, 0.98)) -> dict:
    """Each level with three repeats, its tokens/s scaled a little per repeat."""
    out = {}
    for c, f in levels.items():
        reps = [{**f, "output_tokens_per_s": f["output_tokens_per_s"] * k,
                 "generated_tokens_per_s": None if f.get("generated_tokens_per_s") is None
                 else f["generated_tokens_per_s"] * k} for k in factors]
        out[c] = {**f, "repeats": reps}
    return out


def judged(study: dict) -> list[dict]:
    scalellm.judge(study)
    return [c for c in study["claims"] if c["figure"].startswith("Fig. 8")]


def test_fig8_claims_agree_when_one_replica_wins_low_and_two_win_high():
    study = study_of({1: with_repeats(ONE), 2: with_repeats(TWO)})
    add_replica_ratios(study)
    low, high = judged(study)
    assert (low["figure"], high["figure"]) == ("Fig. 8a", "Fig. 8b")
    assert (low["verdict"], high["verdict"]) == ("agrees", "agrees")
    assert low["values"] == pytest.approx([0.7, 0.7, 0.7])
    assert "at 1 concurrent" in low["measured"] and "0.70x" in low["measured"]
    assert "at 16 concurrent" in high["measured"] and "1.50x" in high["measured"]
    assert "first ahead (pooled) at 16" in high["measured"] and "timeouts 0 against 2" in high["measured"]
    assert all("this machine's scale" in c["why"] for c in (low, high))


def test_fig8_claims_disagree_when_two_replicas_never_pay_or_win_from_the_start():
    slower = {c: level(f["output_tokens_per_s"] * 0.8, 500.0, 5000.0) for c, f in ONE.items()}
    study = study_of({1: with_repeats(ONE), 2: with_repeats(slower, (1.0, 1.01, 0.99))})
    low, high = judged(study)
    assert (low["verdict"], high["verdict"]) == ("agrees", "disagrees")
    assert "never ahead (pooled) at any level" in high["measured"]
    # at 16 one count has the generated tokens/s and the other not: both compared on completed requests
    assert "0.80x" in high["measured"]
    faster = {**TWO, "1": level(11.0, 150.0, 2000.0)}
    study = study_of({1: with_repeats(ONE), 2: with_repeats(faster)})
    low, high = judged(study)
    assert (low["verdict"], high["verdict"]) == ("disagrees", "agrees")
    assert "first ahead (pooled) at 1" in high["measured"]


def test_one_repeat_of_fig8_is_inconclusive():
    low, high = judged(study_of({1: ONE, 2: TWO}))
    assert low["verdict"] == high["verdict"] == "inconclusive"


def test_a_failed_count_leaves_the_claims_unmeasured_and_its_levels_out():
    error = "RuntimeError: compute-1 died"
    study = study_of({1: ONE, 2: {"1": {"failed": error}}},
                     failed=[{"part": "level 1, 2 replicas, repeat 1", "error": error, "traceback": ""}])
    assert counts_levels(study)[2] == {}
    add_replica_ratios(study)
    assert study["ratios"] == {}
    fig8 = judged(study)
    assert [c["verdict"] for c in fig8] == ["not measured", "not measured"]
    assert all(error in c["measured"] for c in fig8)


def test_one_count_makes_no_fig8_claim_and_no_intro_caveat():
    study = study_of({1: ONE}, replicas=(1,))
    add_replica_ratios(study)
    assert judged(study) == [] and study["ratios"] == {}
    assert replicas_text({"replicas": [1]}, 2) == ""
    text = replicas_text({"replicas": [1, 2], "routing": "least_loaded"}, 2)
    assert "one core" in text and "this machine's scale" in text and "`least_loaded`" in text


def test_the_table_sets_the_counts_side_by_side():
    study = study_of({1: ONE, 2: TWO})
    add_replica_ratios(study)
    table = replica_table(study).splitlines()
    assert table[0].startswith("| concurrent | tokens/s, 1 replica | tokens/s, 2 replicas |")
    row16 = next(line for line in table if line.startswith("| 16 |"))
    assert "| 44.0 | 66.0 |" in row16 and "| 1.50x |" in row16 and "| 0.50x |" in row16
    assert "| 2 | 0 |" in row16                                                # timeouts, 1 then 2 replicas
    assert row16.endswith("| replica-0 9, replica-1 11 |")                      # how routing spread them


def test_a_levels_requests_are_counted_by_the_replica_that_served_them():
    records = [scalellm.RequestRecord(k, "ok", 1.0, ttft_s=0.1, tokens=4, engine_ms=500.0,
                                      frontend_e2e_ms=900.0, gateway_ms=400.0, replica=f"replica-{k % 2}")
               for k in range(5)]
    records.append(scalellm.RequestRecord(5, "timeout", 60.0, replica=""))
    assert scalellm.level_figures(records, 10.0, 60.0)["by_replica"] == {"replica-0": 3, "replica-1": 2}


def test_each_counts_compute_cpus_are_said():
    study = study_of({1: ONE, 2: TWO})
    study["results"]["by_replicas"]["1"]["placement"] = {
        "cpus": {"compute": "0-1", "frontend": "0-1"}, "torch_threads": {"replica-0": 2}}
    study["results"]["by_replicas"]["2"]["placement"] = {
        "cpus": {"compute": "0", "compute-1": "1", "smartnic-1": "0-1"},
        "torch_threads": {"replica-0": 1, "replica-1": 1}}
    assert placements_text(study) == (
        "Compute nodes: 1 replica: compute on CPUs 0-1 (torch threads replica-0: 2); 2 replicas: compute on "
        "CPUs 0, compute-1 on CPUs 1 (torch threads replica-0: 1, replica-1: 1).")


def test_the_page_with_two_counts_shows_fig8_and_each_counts_levels():
    study = study_of({1: ONE, 2: TWO})
    study["results"]["levels"] = study["results"]["by_replicas"]["1"]["levels"]
    add_replica_ratios(study)
    body = scalellm.body_of(study)
    assert body.index("## Fig. 8") < body.index("by level, 2 replicas") < body.index("by level, 1 replica")


def test_replica_options():
    assert scalellm.parse_args([]).replicas == [1]                          # today's study
    args = scalellm.parse_args(["--replicas", "2", "1", "--routing", "kv_aware"])
    assert args.replicas == [1, 2] and args.routing == "kv_aware"
    assert scalellm.parse_args(["--replicas", "1", "2"]).routing == "least_loaded"
    for bad in (["--replicas", "0"], ["--replicas", "9"], ["--routing", "random"]):
        with pytest.raises(SystemExit):
            scalellm.parse_args(bad)
    config = {"frontend": {"users": {}}, "compute": {}}
    assert scalellm.replicas_config(config, 1, "least_loaded") is config
    assert scalellm.replicas_config(config, 2, "least_loaded")["frontend"]["routing"] == "least_loaded"
    assert "routing" not in config["frontend"]


@pytest.mark.slow
def test_smoke_run_with_one_and_two_replicas(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("study", "scalellm", "--smoke", "--json", "--out", str(out),
                                    "--replicas", "1", "2"),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    study = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, (study.get("failed"), done.stderr[-3000:])
    assert study["settings"]["replicas"] == [1, 2] and study["settings"]["routing"] == "least_loaded"
    by = study["results"]["by_replicas"]
    assert study["results"]["levels"] == by["1"]["levels"]
    for n in ("1", "2"):
        for c, f in by[n]["levels"].items():
            assert f["completed"] == f["requests"] == int(c)
            assert f["generated_tokens"] >= f["output_tokens"] > 0              # every replica's counted
            assert sum(f["by_replica"].values()) == f["summaries"] == f["completed"]
            assert set(f["by_replica"]) <= {f"replica-{i}" for i in range(int(n))}
    assert "compute-1" in by["2"]["levels"]["2"]["cpu_cores"]
    for c in ("1", "2"):
        assert math.isfinite(study["ratios"][f"tokens_per_s_2r_vs_1r_at_{c}"])
    fig8 = [c for c in study["claims"] if c["figure"].startswith("Fig. 8")]
    assert len(fig8) == 2 and all(c["verdict"] == "inconclusive" for c in fig8)   # one repeat
    assert "## Fig. 8" in (out / "README.md").read_text()
