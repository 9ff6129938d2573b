"""kvtb study eviction: its options, claims and headline from an in-process --smoke run (the replay
only: --real-requests 0), and a --smoke run's JSON contract (slow: real processes, the tiny model)."""
import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from bench.study import eviction
from bench.study.eviction import headline_rows, parse_args
from kvtb.launch import kvtb_argv


def test_modes_set_the_trace_capacities_and_the_real_check():
    full, quick, smoke = parse_args([]), parse_args(["--quick"]), parse_args(["--smoke"])
    assert full.requests == 3000 and len(full.capacities) == 8 and full.real_requests == 100
    assert quick.requests == 1500 and 0.25 in quick.capacities and quick.real_requests == 40
    assert smoke.requests == 200 and smoke.real_requests == 6
    assert full.real_policies == ["lru", "on_reuse"] and quick.real_policies == ["lru"]
    given = parse_args(["--smoke", "--capacities", "0.5", "0.1", "--requests", "50", "--real-requests", "4"])
    assert given.capacities == [0.1, 0.5] and given.requests == 50 and given.real_requests == 4
    assert parse_args(["--trace", "x.jsonl"]).requests == 0  # a file: all of it
    with pytest.raises(SystemExit):
        parse_args(["--capacities", "1.5"])


def test_block_ids_make_equal_ids_equal_tokens():
    from bench.mooncake import TraceRequest
    a = eviction.prompt_ids(TraceRequest(0, 70, 1, (0, 1, 2)), 32, 1)
    b = eviction.prompt_ids(TraceRequest(0, 40, 1, (0, 1)), 32, 1)
    assert len(a) == 70 and len(b) == 40 and a[:40] == b
    assert eviction.block_ids(5, 32, 1) != eviction.block_ids(6, 32, 1)


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("eviction")
    args = parse_args(["--smoke", "--out", str(out), "--requests", "400", "--real-requests", "0"])
    study, title, intro, body = eviction.run(args)
    return study, body


def test_the_replay_fills_every_curve_and_claim(smoke_study):
    study, body = smoke_study
    assert study["failed"] == []
    curves = study["results"]["curves"]
    for policy in ("lru", "timer", "both", "on_reuse", "belady"):
        assert set(curves[policy]) == {"0.1", "0.25", "1"}
    ideal = study["results"]["ideal"]["hit_rate"]
    for f in ("0.1", "0.25", "1"):
        for policy in ("lru", "both", "on_reuse", "timer"):
            assert curves[policy][f]["hit_rate"] <= curves["belady"][f]["hit_rate"] + 1e-12
        assert curves["belady"][f]["hit_rate"] <= ideal + 1e-12
        assert curves["timer"][f]["peak_blocks"] <= curves["lru"][f]["capacity_blocks"]
    assert curves["lru"]["1"]["hit_rate"] == pytest.approx(ideal)  # nothing evicted at the whole working set
    assert [c["agrees"] for c in study["claims"]][-1] is None  # the real check was skipped
    assert "skipped" in study["claims"][-1]["measured"]
    assert all(c["measured"] for c in study["claims"])
    assert "lru_vs_belady_at_0.25" in study["ratios"] and "on_reuse_puts_saved_at_0.25" in study["ratios"]
    assert "synthetic" in body and "| capacity |" in body
    rows = headline_rows(study)
    assert len(rows) == 1 and rows[0]["measured"].count("/") == 4


def test_a_failed_replay_is_reported_in_claims_and_headline():
    study = {"study": "eviction", "settings": {"capacities": [0.25], "trace": None, "real_requests": 0,
                                               "real_policies": ["lru"]},
             "results": {}, "claims": [], "ratios": {},
             "failed": [{"part": "trace", "error": "ValueError: boom"}]}
    eviction.add_ratios(study)
    eviction.add_claims(study)
    assert study["claims"] and all(c["agrees"] is None for c in study["claims"])
    assert "boom" in study["claims"][0]["measured"]
    assert headline_rows(study)[0]["measured"] == "failed: ValueError: boom"


@pytest.mark.slow
def test_smoke_run_keeps_the_json_contract(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("study", "eviction", "--smoke", "--json", "--out", str(out)),
                          capture_output=True, text=True, timeout=300, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    study = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("study", "machine", "settings", "results", "claims", "ratios", "plots"):
        assert key in study, key
    assert study["study"] == "eviction" and study["mode"] == "smoke" and study["failed"] == []
    assert study == json.loads((out / "results.json").read_text())
    assert (out / "README.md").read_text().startswith("# Eviction")
    assert study["claims"]
    for c in study["claims"]:
        assert set(c) == {"figure", "claim", "measured", "agrees", "why"} and c["measured"]
    real = study["results"]["real"]["runs"]["lru"]
    assert len(real["hits_per_request"]) == 6 and real["capacity_blocks"] > 0
    assert study["claims"][-1]["agrees"] is not None
    assert "real_vs_simulated_hit_rate_lru" in study["ratios"]
    assert all(not isinstance(v, float) or math.isfinite(v) for v in study["ratios"].values())
    assert len(study["plots"]) == 1 and all(Path(p).exists() for p in study["plots"])
    assert len(headline_rows(study)) == 2


@pytest.mark.slow
def test_smoke_run_under_a_profile_records_d_and_violations(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("study", "eviction", "--smoke", "--json", "--out", str(out),
                                    "--profile", "polaris-a100", "--dilation", "3"),
                          capture_output=True, text=True, timeout=600, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    study = json.loads(done.stdout.strip().splitlines()[-1])
    scale = study["scale"]
    assert scale["profile"] == "polaris-a100" and scale["dilation"] == 3.0
    assert scale["pacing"]["kinds"]["gpu_step"]["ops"] > 0
    assert study["failed"] == [] and len(study["results"]["real"]["runs"]["lru"]["hits_per_request"]) == 6
    assert "times are virtual (wall / D), D = 3" in (out / "README.md").read_text()
