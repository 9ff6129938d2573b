"""`kvtb bench followup`: the path checks, figures, ratios and table on hand-made records, and a --smoke
run on two real replicas (slow: real services, the tiny model)."""
from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from bench import followup
from bench.followup import PATHS, add_ratios, flag_problems, path_figures, path_problem, sample
from kvtb.launch import kvtb_argv
from kvtb_proto import compute_pb2

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def record(kv_source="restored", cached=0, reused=0, restored=0, other=0, replica="replica-1", ttft_ms=5.0):
    return compute_pb2.TurnRecord(kv_source=kv_source, tokens_cached=cached, tokens_reused=reused,
                                  tokens_prefilled=10, blocks_restored=restored, blocks_restored_other=other,
                                  replica=replica, ttft_ms=ttft_ms)


ON_PATH = {"same": record("resident", cached=256, reused=256, replica="replica-0"),
           "same_storage": record("restored", reused=256, restored=8, replica="replica-0"),
           "other": record("restored", reused=256, restored=8, other=8),
           "recompute": record("none")}


@pytest.mark.parametrize("path", PATHS)
def test_a_follow_up_on_its_path_passes(path):
    replica = "replica-0" if followup.ON_FIRST[path] else "replica-1"
    assert path_problem(path, ON_PATH[path], replica) == ""


@pytest.mark.parametrize(("path", "wrong"), [
    ("same", record("restored", reused=256, restored=8, replica="replica-0")),   # the pool had lost it
    ("same", record("recomputed", replica="replica-0")),
    ("same_storage", record("resident", cached=256, reused=256, replica="replica-0")),  # never released
    ("same_storage", record("restored", reused=256, restored=8, other=2, replica="replica-0")),
    ("other", record("restored", reused=256, restored=8)),            # found in its own index: not other
    ("other", record("recomputed")),                                  # the miss path found nothing
    ("other", record("partial", reused=128, restored=4, other=4)),    # half of it failed to land
    ("recompute", record("resident", cached=32, reused=32)),          # something was reused
    ("recompute", record("restored", reused=256, restored=8, other=8)),
])
def test_a_follow_up_off_its_path_is_flagged_with_what_it_did(path, wrong):
    replica = "replica-0" if followup.ON_FIRST[path] else "replica-1"
    problem = path_problem(path, wrong, replica)
    assert problem.startswith(f"{path}: expected") and f"kv_source {wrong.kv_source!r}" in problem


def test_a_follow_up_that_ran_on_another_replica_is_flagged():
    assert path_problem("other", ON_PATH["other"], "replica-0") == "ran on replica-1, not replica-0"
    # a record that names no replica (an agent that does not say) is judged on its fields alone
    unnamed = record("restored", reused=256, restored=8, other=8, replica="")
    assert path_problem("other", unnamed, "replica-0") == ""
    with pytest.raises(ValueError, match="unknown path"):
        path_problem("elsewhere", ON_PATH["other"], "replica-1")


def samples_of(path: str, ttfts: list[float], wrong: set[int] = frozenset()) -> list[dict]:
    replica = "replica-0" if followup.ON_FIRST[path] else "replica-1"
    good = ON_PATH[path]
    bad = record("recomputed", replica=replica) if path != "recompute" else record("resident", cached=32)
    return [sample(path, t, bad if i in wrong else good, replica, i) for i, t in enumerate(ttfts)]


def test_flagged_follow_ups_are_left_out_of_the_figures_and_reported_failed():
    samples = {"same": samples_of("same", [0.010, 0.012, 0.011]),
               "same_storage": samples_of("same_storage", [0.020, 0.022, 0.021]),
               "other": samples_of("other", [0.030, 9.0, 0.034], wrong={1}),     # 9 s: off its path
               "recompute": samples_of("recompute", [0.300, 0.320, 0.310])}
    figures = {p: path_figures(s) for p, s in samples.items()}
    assert figures["other"]["runs"] == 3 and figures["other"]["flagged"] == 1
    assert figures["other"]["ttft_s"]["p50"] == pytest.approx(0.032)         # 9 s never counted
    assert figures["other"]["ttft_s"]["max"] == pytest.approx(0.034)
    result = {"bench": "followup", "results": {"histories": {"256": {"paths": figures}}}, "ratios": {},
              "failed": [], "settings": {"rounds": 3}}
    problems = flag_problems(result, 256, samples)
    assert len(problems) == 1 and problems[0].startswith("round 1: other: expected")
    assert result["failed"] == [{"part": "256 tokens", "error": "WrongPath: " + problems[0]}]
    add_ratios(result)
    r = result["ratios"]
    assert r["other_vs_same_256"] == pytest.approx(0.032 / 0.011)
    assert r["other_vs_same_storage_256"] == pytest.approx(0.032 / 0.021)
    assert r["same_storage_vs_same_256"] == pytest.approx(0.021 / 0.011)
    assert r["recompute_vs_other_256"] == pytest.approx(0.310 / 0.032)
    result["results"]["histories"]["256"]["history_tokens"] = 256
    text = followup.table(result)
    assert "2.91" in text and "9.69" in text and "FAILED 256 tokens: WrongPath" in text


def test_a_path_with_every_follow_up_flagged_gives_no_ratio():
    figures = {"same": path_figures(samples_of("same", [0.01])),
               "other": path_figures(samples_of("other", [0.03, 0.04], wrong={0, 1})),
               "recompute": path_figures(samples_of("recompute", [0.3]))}
    assert figures["other"]["ttft_s"] is None and figures["other"]["flagged"] == 2
    assert followup.history_ratios(figures) == {}                     # every ratio involves `other`


def test_rounds_rotate_the_paths_and_swap_the_replicas():
    assert [followup.rotated(r)[0] for r in range(4)] == list(PATHS)
    assert all(sorted(followup.rotated(r)) == sorted(PATHS) for r in range(5))


def test_options_default_and_smoke_and_refuse_nonsense():
    args = followup.parse_args([])
    assert args.histories == [256, 1024, 2048] and args.rounds == 4 and args.max_new_tokens == 2
    smoke = followup.parse_args(["--smoke"])
    assert smoke.histories == [64, 160] and smoke.rounds == 2
    mine = followup.parse_args(["--histories", "1024", "256", "--rounds", "3", "--max-new-tokens", "4"])
    assert (mine.histories, mine.rounds, mine.max_new_tokens) == ([256, 1024], 3, 4)
    with pytest.raises(SystemExit):
        followup.parse_args(["--rounds", "0"])


@pytest.mark.slow
def test_smoke_run_on_two_replicas_measures_every_path_on_its_path(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("bench", "followup", "--smoke", "--json", "--out", str(out)),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, (result.get("failed"), done.stderr[-3000:])
    assert result["failed"] == [] and result["settings"]["replicas"] == 2
    for n in ("64", "160"):
        row = result["results"]["histories"][n]
        for path in PATHS:
            assert row["paths"][path]["runs"] == 2 and row["paths"][path]["flagged"] == 0
            assert {s["replica"] for s in row["samples"][path]} == {"replica-0", "replica-1"}  # swapped
            assert all(s["record_replica"] == s["replica"] for s in row["samples"][path])  # the agent says so
        assert all(s["blocks_restored_other"] > 0 for s in row["samples"]["other"])
        for name in followup.RATIOS:
            assert math.isfinite(result["ratios"][f"{name}_{n}"])
