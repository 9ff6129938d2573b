"""The benchmarks' pure helpers: crossover, Zipf draws, reply comparison, working set."""
from __future__ import annotations

import math

import pytest

from kvtb.bench import analysis
from kvtb.bench.datapath import calibration_transfers
from kvtb.bench.eviction import agent_settings, mean_gap, working_set_bytes


def test_crossover_interpolates_in_log2_tokens():
    # ratio recompute/restore: 0.5 at 256, 2.0 at 1024 -> 1.0 a third of the way in log2 -> 2**(8 + 2/3)
    got = analysis.crossover([256, 1024], [0.5, 4.0], [1.0, 2.0])
    assert got["where"] == "measured"
    assert got["tokens"] == pytest.approx(2 ** (8 + 2 / 3))


def test_crossover_below_smallest_and_above_largest():
    assert analysis.crossover([512, 256], [2.0, 1.0], [1.0, 1.0]) == {
        "tokens": None, "where": "below_smallest", "smallest": 256}
    assert analysis.crossover([256, 512], [0.1, 0.2], [1.0, 1.0])["where"] == "above_largest"


def test_crossover_at_exactly_one_is_the_smallest_size():
    assert analysis.crossover([256], [1.0], [1.0])["where"] == "below_smallest"


def test_zipf_weights_and_schedule():
    w = analysis.zipf_weights(3, 1.0)
    assert sum(w) == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(2.0) and w[0] / w[2] == pytest.approx(3.0)
    a = analysis.zipf_schedule(10, 500, 1.1, seed=3)
    assert a == analysis.zipf_schedule(10, 500, 1.1, seed=3)
    assert a.count(0) > a.count(9) and set(a) <= set(range(10))


def test_think_times_are_seeded_with_the_mean():
    t = analysis.think_times(4000, 0.5, seed=1)
    assert t == analysis.think_times(4000, 0.5, seed=1)
    assert sum(t) / len(t) == pytest.approx(0.5, rel=0.1)
    assert analysis.think_times(3, 0.0, seed=1) == [0.0, 0.0, 0.0]


def test_first_difference_names_the_conversation_and_turn():
    want = {"a": ["x", "y"], "b": ["z"]}
    assert analysis.first_difference(want, {"a": ["x", "y"], "b": ["z"]}) == []
    diff = analysis.first_difference(want, {"a": ["x", "Y"], "b": []})
    assert diff == ["a turn 2: expected 'y', got 'Y'", "b turn 1: expected 'z', got '(no reply)'"]


def test_hit_rate():
    assert analysis.hit_rate(3, 4) == 0.75 and analysis.hit_rate(0, 0) == 0.0


def test_working_set_and_revisit_gap():
    # users 0 (3 visits) and 1 (1 visit): (10 + 3*2) + (10 + 1*2) tokens of 100 bytes
    assert working_set_bytes([0, 1, 0, 0], 10, 2, 100) == (16 + 12) * 100
    assert mean_gap([0, 1, 0, 0]) == pytest.approx(1.5)
    assert mean_gap([0, 1]) == 1.0


def test_agent_settings_scale_capacity_and_ttl():
    s = agent_settings("both", 0.5, {"working_set_bytes": 1000, "mean_revisit_s": 4.0})
    assert s == {"eviction_policy": "both", "capacity_high_bytes": 500, "capacity_low_bytes": 400,
                 "ttl_s": 2.0, "eviction_interval_s": 0.05}


def test_calibration_transfers_are_per_chunk_seconds():
    rows = [{"chunk_bytes": 1 << 20, "put_bytes_per_s": 2 ** 21, "get_bytes_per_s": 2 ** 22,
             "storage_node_direct": {"put_bytes_per_s": 2 ** 20, "get_bytes_per_s": 2 ** 23}}]
    got = {(t["mode"], t["direction"]): t["seconds"] for t in calibration_transfers(rows)}
    assert got == {("triggered", "put"): 0.5, ("triggered", "get"): 0.25,
                   ("cpu", "put"): 1.0, ("cpu", "get"): 0.125}
    assert all(not math.isnan(v) for v in got.values())
