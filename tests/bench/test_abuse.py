"""The abuse benchmark: its figures and targets (pure), and a smoke run against real storage nodes."""
from __future__ import annotations

import itertools
import json
import math
import subprocess

import pytest

from bench.abuse import (
    CEILINGS,
    FLOORS,
    add_ratios,
    adjacent_ranges,
    bench_settings,
    parse_args,
    reconnect_figures,
    spread_ranges,
    table,
)
from bench.results import new_result
from kvtb.cli import COMMANDS
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

MIB = 1 << 20


def restart(kind: str, seconds: float, before_mib: int, peak_mib: int, after_mib: int | None = None) -> dict:
    return {"kind": kind, "gave_up": False, "reconnect_s": seconds, "rss_before_bytes": before_mib * MIB,
            "rss_peak_bytes": peak_mib * MIB, "rss_after_bytes": (after_mib or before_mib) * MIB,
            "flood_answered": 3 if kind == "flooded" else 0}


def result_of(runs: list[dict], frames_peak_mib: int = 40, spread_status: str = "invalid field",
              spread_s: float = 0.01) -> dict:
    result = new_result("abuse", bench_settings(parse_args(["--smoke"])))
    result["results"] = {
        "reconnect": {"runs": runs, "summary": reconnect_figures(runs)},
        "frames": {"frames": 3, "frame_bytes": 64 * MIB, "rss_before_bytes": 30 * MIB,
                   "rss_peak_bytes": frames_peak_mib * MIB, "rss_after_each_bytes": [], "rss_after_bytes": 30 * MIB,
                   "store_after": {"status": "success", "seconds": 0.01, "bytes": 0}, "node_alive": True},
        "ranges": {"value_bytes": 8 * MIB, "store": {"status": "success", "seconds": 0.1, "bytes": 0},
                   "max_ranges": 1024, "node_alive": True, "reads": {
                       "spread": {"ranges": 4096, "status": spread_status, "seconds": spread_s, "bytes": 0},
                       "adjacent": {"ranges": 4096, "status": "success", "seconds": 0.02, "bytes": 4096},
                       "spread_at_cap": {"ranges": 1024, "status": "success", "seconds": 0.02, "bytes": 1024}}}}
    add_ratios(result)
    return result


def test_medians_ratio_and_memory_growth_of_the_restarts():
    runs = [restart("quiet", 1.0, 30, 32), restart("flooded", 1.5, 31, 60, 35),
            restart("quiet", 2.0, 35, 36), restart("flooded", 9.0, 36, 40, 300),
            restart("quiet", 3.0, 300, 40), restart("flooded", 2.5, 40, 45)]
    summary = reconnect_figures(runs)
    assert summary["quiet"]["reconnect_p50_s"] == 2.0 and summary["flooded"]["reconnect_p50_s"] == 2.5
    assert summary["flooded"]["rss_growth_max_bytes"] == (300 - 36) * MIB  # the later reading, when higher
    result = result_of(runs)
    assert math.isclose(result["ratios"]["reconnect_p50_flooded_vs_quiet"], 1.25)
    assert math.isclose(result["ratios"]["reconnect_p50_flooded_minus_quiet_s"], 0.5)
    assert result["floors"]["reconnect_p50_flooded_vs_quiet"] == {"ceiling": 2.0, "value": 1.25, "met": True}
    assert result["floors"]["flood_rss_growth_mib"] == {"ceiling": 256.0, "value": 264.0, "met": False}
    text = table(result)
    assert "NOT MET" in text and "quiet 2.00 s, flooded 2.50 s" in text and "9.00" in text


def test_every_target_is_evaluated_and_a_failed_one_shows():
    met = result_of([restart("quiet", 1.0, 30, 31), restart("flooded", 1.2, 31, 40)])
    assert set(met["floors"]) == set(FLOORS) | set(CEILINGS)
    assert all(f["met"] for f in met["floors"].values())
    slow_refusal = result_of([restart("quiet", 1.0, 30, 31), restart("flooded", 3.0, 31, 40)],
                             frames_peak_mib=2000, spread_status="success", spread_s=80.0)
    failed = {name for name, f in slow_refusal["floors"].items() if not f["met"]}
    assert failed == {"reconnect_p50_flooded_vs_quiet", "frames_rss_growth_mib",
                      "ranges_spread_refused_invalid_field", "ranges_spread_answer_s"}


def test_a_part_not_run_has_no_target():
    result = new_result("abuse", {})
    add_ratios(result)
    assert result["ratios"] == {} and result["floors"] == {}


def test_the_spread_ranges_never_touch_and_the_adjacent_ones_do():
    spread = spread_ranges(b"k", 8 * MIB, 4096)
    assert len(spread) == 4096 and all(b[1] - a[1] > 1 for a, b in itertools.pairwise(spread))
    assert spread[-1][1] < 8 * MIB
    adjacent = adjacent_ranges(b"k", 4096)
    assert [o for _, o, _ in adjacent] == list(range(4096))


def test_defaults_are_issue_31s_and_the_command_is_wired():
    args = parse_args([])
    assert (args.connections, args.repeats, args.frames, args.frame_mib, args.value_mib, args.ranges) == \
        (1100, 3, 3, 1024, 200, 4096)
    smoke = parse_args(["--smoke"])
    assert smoke.connections == 64 and smoke.frame_mib == 64 and smoke.value_mib == 8
    with pytest.raises(SystemExit):
        parse_args(["--frame-mib", "8"])  # not over the node's frame cap: it would measure nothing
    with pytest.raises(SystemExit):
        parse_args(["--parts", "reconnect,nope"])
    assert COMMANDS[("bench", "abuse")] == "bench.abuse:main"


@pytest.mark.slow
def test_smoke_run_against_real_nodes(tmp_path):
    """`kvtb bench abuse --smoke`: three real nodes with fabric security; the bounds hold."""
    done = subprocess.run(kvtb_argv("bench", "abuse", "--smoke", "--json", "--out", str(tmp_path)),
                          check=False, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "results.json").read_text())
    assert result["bench"] == "abuse" and result["failed"] == [] and result["machine"]["git_commit"]
    r = result["results"]
    assert [run["kind"] for run in r["reconnect"]["runs"]] == ["quiet", "flooded"]
    assert all(run["rss_before_bytes"] > 0 and run["rss_peak_bytes"] > 0 for run in r["reconnect"]["runs"])
    assert set(result["floors"]) == set(FLOORS) | set(CEILINGS)  # every target evaluated
    assert all(isinstance(f["met"], bool) for f in result["floors"].values())
    # what the node's bounds guarantee whatever the machine's speed
    assert r["ranges"]["reads"]["spread"]["status"] == "invalid field"
    assert r["ranges"]["reads"]["adjacent"] == {**r["ranges"]["reads"]["adjacent"], "status": "success",
                                                "bytes": 4096}
    assert r["frames"]["store_after"]["status"] == "success" and r["frames"]["node_alive"]
    assert result["ratios"]["flood_rss_growth_mib"] < 256 and result["ratios"]["frames_rss_growth_mib"] < 256
