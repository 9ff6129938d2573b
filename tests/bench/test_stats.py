from __future__ import annotations

import math

import pytest

from bench import stats


def test_mean_median():
    assert stats.mean([1, 2, 3, 4]) == 2.5
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5


def test_percentile_type7_by_hand():
    vals = [10, 20, 30, 40, 50]
    # h = 4 * q / 100: p25 -> h = 1 -> 20; p90 -> h = 3.6 -> 40 + 0.6 * 10 = 46
    assert stats.percentile(vals, 25) == 20
    assert stats.percentile(vals, 90) == pytest.approx(46)
    # p99 -> h = 3.96 -> 40 + 0.96 * 10 = 49.6
    assert stats.percentile(vals, 99) == pytest.approx(49.6)
    assert stats.percentile(vals, 0) == 10 and stats.percentile(vals, 100) == 50
    assert stats.percentile([7.0], 99) == 7.0


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    vals = [0.3, 5.0, 1.2, 9.9, 2.2, 2.2, 7.1]
    for q in (1, 50, 73, 99):
        assert stats.percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1], 101)


def test_summarize_by_hand():
    s = stats.summarize([1, 2, 3, 4])
    assert s["n"] == 4 and s["mean"] == 2.5 and s["p50"] == 2.5
    assert s["p99"] == pytest.approx(3.97)  # h = 3 * 0.99 = 2.97 -> 3 + 0.97 * 1
    assert s["min"] == 1 and s["max"] == 4
    assert s["stdev"] == pytest.approx(math.sqrt(5 / 3))  # squares 2.25+0.25+0.25+2.25 = 5, / 3


def test_ratio():
    assert stats.ratio(10, 4) == 2.5
    assert stats.ratio(1, 0) == math.inf
    assert math.isnan(stats.ratio(0, 0))


def test_crossover_interpolates_in_log2_tokens():
    # ratio recompute/restore: 0.5 at 256, 2.0 at 1024 -> 1.0 a third of the way in log2 -> 2**(8 + 2/3)
    got = stats.crossover([256, 1024], [0.5, 4.0], [1.0, 2.0])
    assert got["where"] == "measured"
    assert got["tokens"] == pytest.approx(2 ** (8 + 2 / 3))


def test_crossover_below_smallest_and_above_largest():
    assert stats.crossover([512, 256], [2.0, 1.0], [1.0, 1.0]) == {
        "tokens": None, "where": "below_smallest", "smallest": 256}
    assert stats.crossover([256, 512], [0.1, 0.2], [1.0, 1.0])["where"] == "above_largest"
    assert stats.crossover([256], [1.0], [1.0])["where"] == "below_smallest"  # exactly 1: the smallest size


def test_hit_rate():
    assert stats.hit_rate(3, 4) == 0.75 and stats.hit_rate(0, 0) == 0.0
