"""The eviction benchmark's plan: Zipf visits, think times, working set, the agent's settings (pure)."""
from __future__ import annotations

import pytest

from bench.eviction import agent_settings, mean_gap, think_times, working_set_bytes, zipf_schedule

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_zipf_schedule_is_seeded_and_favours_the_first_users():
    a = zipf_schedule(10, 500, 1.1, seed=3)
    assert a == zipf_schedule(10, 500, 1.1, seed=3) and a != zipf_schedule(10, 500, 1.1, seed=4)
    assert a.count(0) > a.count(9) and set(a) <= set(range(10))
    b = zipf_schedule(3, 30_000, 1.0, seed=1)  # weights 1, 1/2, 1/3
    assert b.count(0) / b.count(1) == pytest.approx(2.0, rel=0.1)
    assert b.count(0) / b.count(2) == pytest.approx(3.0, rel=0.1)


def test_think_times_are_seeded_with_the_mean():
    t = think_times(4000, 0.5, seed=1)
    assert t == think_times(4000, 0.5, seed=1)
    assert sum(t) / len(t) == pytest.approx(0.5, rel=0.1)
    assert think_times(3, 0.0, seed=1) == [0.0, 0.0, 0.0]


def test_working_set_and_revisit_gap():
    # users 0 (3 visits) and 1 (1 visit): (10 + 3*2) + (10 + 1*2) tokens of 100 bytes
    assert working_set_bytes([0, 1, 0, 0], 10, 2, 100) == (16 + 12) * 100
    assert mean_gap([0, 1, 0, 0]) == pytest.approx(1.5)
    assert mean_gap([0, 1]) == 1.0


def test_agent_settings_scale_capacity_and_ttl():
    s = agent_settings("both", 0.5, {"working_set_bytes": 1000, "mean_revisit_s": 4.0})
    assert s == {"eviction_policy": "both", "capacity_high_bytes": 500, "capacity_low_bytes": 400,
                 "ttl_s": 2.0, "eviction_interval_s": 0.05}


def test_a_failed_policy_and_fraction_is_reported_and_the_others_still_run(monkeypatch, tmp_path):
    from bench import eviction

    def fake_run_config(args, policy, fraction, p, progress):
        if (policy, fraction) == ("timer", 0.5):
            raise RuntimeError("the agent exited")
        return {"follow_ups": 4, "hits": 2, "hit_rate": 0.5, "ttft_mean_s": 0.1, "evictions_by_reason": {},
                "agent": {"capacity_high_bytes": 1e6, "ttl_s": 1.0}}
    monkeypatch.setattr(eviction, "make_plan", lambda args: {"working_set_bytes": 1e6, "mean_revisit_s": 1.0,
                                                              "schedule": []})
    monkeypatch.setattr(eviction, "run_config", fake_run_config)
    monkeypatch.setattr(eviction, "plot", lambda result, out: None)
    args = eviction.parse_args(["--policies", "lru", "timer", "--fractions", "0.5", "1.0",
                                "--out", str(tmp_path)])
    result = eviction.run(args)
    assert result["failed"] == [{"part": "timer_0.5", "error": "RuntimeError: the agent exited"}]
    assert set(result["results"]["runs"]) == {"lru_0.5", "lru_1.0", "timer_1.0"}
    assert "failed: RuntimeError: the agent exited" in eviction.table(result)
