"""kvtb study eviction: its options, claims and headline from an in-process --smoke run (the replay
only: --real-requests 0), and a --smoke run's JSON contract (slow: real processes, the tiny model)."""
import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from bench.study import eviction, eviction_real
from bench.study.claims import verdict
from bench.study.eviction import CLAIMS, headline_rows, parse_args
from bench.study.eviction_claims import TOLERANCE
from bench.study.report import judge
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_modes_set_the_trace_capacities_and_the_real_check():
    full, quick, smoke = parse_args([]), parse_args(["--quick"]), parse_args(["--smoke"])
    assert full.requests == 3000 and len(full.capacities) == 8 and full.real_requests == 60
    assert quick.requests == 1500 and 0.25 in quick.capacities and quick.real_requests == 25
    assert smoke.requests == 200 and smoke.real_requests == 6
    assert (full.real_repeats, quick.real_repeats, smoke.real_repeats) == (3, 3, 1)
    assert full.real_policies == ["lru", "on_reuse"] and quick.real_policies == ["lru"]
    given = parse_args(["--smoke", "--capacities", "0.5", "0.1", "--requests", "50", "--real-requests", "4"])
    assert given.capacities == [0.1, 0.5] and given.requests == 50 and given.real_requests == 4
    assert parse_args(["--trace", "x.jsonl"]).requests == 0  # a file: all of it
    with pytest.raises(SystemExit):
        parse_args(["--capacities", "1.5"])
    with pytest.raises(SystemExit):
        parse_args(["--real-repeats", "0"])


def test_block_ids_make_equal_ids_equal_tokens():
    from bench.mooncake import TraceRequest
    a = eviction_real.prompt_ids(TraceRequest(0, 70, 1, (0, 1, 2)), 32, 1)
    b = eviction_real.prompt_ids(TraceRequest(0, 40, 1, (0, 1)), 32, 1)
    assert len(a) == 70 and len(b) == 40 and a[:40] == b
    assert eviction_real.block_ids(5, 32, 1) != eviction_real.block_ids(6, 32, 1)


def test_the_claims_table_quotes_the_seed_once_and_cites_sec_iii_b():
    assert eviction.SEED == "triggered-ops-kv-cache-paper.txt"
    assert len({c.key for c in CLAIMS}) == len(CLAIMS)
    seed = [c for c in CLAIMS if c.source == "seed"]
    assert [c.figure for c in seed] == ["Sec. III-B"]
    assert "Table II" not in " ".join(c.figure for c in CLAIMS)
    assert all(c.noise == "measured" and c.repeats >= 3 for c in seed)  # the real check varies run to run


def _real_runs(pairs):
    return {"real": {"runs": {"lru": [
        {"policy": "lru", "hit_rate": real, "simulated": {"hit_rate": sim}, "capacity_blocks": 10,
         "requests_differing": 0, "hits_per_request": [0] * 5} for real, sim in pairs]}}}


def test_the_real_agents_claim_can_agree_disagree_or_stay_inconclusive():
    claim = next(c for c in CLAIMS if c.key == "sec3b_lru_on_the_nic_cpu")

    def judged(pairs):
        return verdict(claim.evidence(_real_runs(pairs)).values, claim.test, claim.repeats, claim.noise)[0]
    assert judged([(0.10, 0.10), (0.11, 0.10), (0.10, 0.10)]) == "agrees"
    assert judged([(0.20, 0.10), (0.21, 0.10), (0.19, 0.10)]) == "disagrees"
    assert judged([(0.10, 0.10), (0.10 + 4 * TOLERANCE, 0.10), (0.10, 0.10)]) == "inconclusive"
    assert judged([(0.10, 0.10)]) == "inconclusive"  # one repeat (smoke)


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
    by_key = {c["key"]: c for c in study["claims"]}
    assert set(by_key) == {c.key for c in CLAIMS}
    real = by_key["sec3b_lru_on_the_nic_cpu"]
    assert real["verdict"] == "not measured" and "skipped" in real["measured"]  # --real-requests 0
    assert by_key["belady_bound"]["verdict"] == "agrees"  # no policy beats Belady
    assert all(by_key[k]["verdict"] in ("agrees", "disagrees") for k in by_key
               if k.startswith(("mooncake", "on_reuse_puts", "on_reuse_first")))  # computed: one value judges
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
    judge(study, CLAIMS)
    assert study["claims"] and all(c["verdict"] == "not measured" for c in study["claims"])
    assert all("boom" in c["measured"] for c in study["claims"])
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
        assert {"key", "figure", "claim", "source", "measured", "values", "verdict", "why"} <= set(c)
        assert c["measured"] and c["verdict"]
    runs = study["results"]["real"]["runs"]["lru"]
    assert len(runs) == 1 and len(runs[0]["hits_per_request"]) == 6 and runs[0]["capacity_blocks"] > 0
    real = next(c for c in study["claims"] if c["key"] == "sec3b_lru_on_the_nic_cpu")
    assert real["verdict"] == "inconclusive" and len(real["values"]) == 1  # smoke: one repeat
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
    assert study["failed"] == [] and len(study["results"]["real"]["runs"]["lru"][0]["hits_per_request"]) == 6
    assert "times are virtual (wall / D), D = 3" in (out / "README.md").read_text()
