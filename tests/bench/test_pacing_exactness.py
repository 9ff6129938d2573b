"""Pacing exactness: a plain operation paced at D comes out at its modeled virtual time, one that is
slower than its budget is a violation and shows as such."""
from __future__ import annotations

import time

import pytest

from bench import pacing_exactness as pe
from scale import ops
from scale import profile as pf
from scale.dilation import Pacer


def test_a_paced_operation_faster_than_its_budget_takes_exactly_its_modeled_virtual_time():
    pacer = Pacer(50.0)
    virtual = pe.virtual_times(pacer, "x", 0.002, lambda: None, 3)  # 100 ms of wall each
    s = pe.summary(0.002, virtual, pacer.snapshot()["kinds"]["x"]["violations"])
    assert s["within"] and s["ratio"] == pytest.approx(1.0, abs=0.05) and s["violations"] == 0


def test_a_slower_one_is_a_violation_and_not_within():
    pacer = Pacer(2.0)
    virtual = pe.virtual_times(pacer, "x", 0.001, lambda: time.sleep(0.02), 2)  # 20 ms real > 2 ms budget
    s = pe.summary(0.001, virtual, pacer.snapshot()["kinds"]["x"]["violations"])
    assert s["violations"] == 2 and not s["within"] and s["ratio"] > 5


def test_the_copy_under_polaris_a100_is_within_five_percent():
    p = pf.load("polaris-a100")
    modeled = ops.modeled_s(p, "swap_out", pe.COPY_BYTES)  # 10 us + 64 MiB / 25 GB/s = 2.69 ms
    assert modeled == pytest.approx(1e-5 + 64 * 2**20 / 2.5e10)
    result = pe.exactness(p, dilation=100.0, repeats=3)  # 269 ms of budget against a ~10-30 ms copy
    copy = result["host copy 64 MiB"]
    assert copy["within"], copy
    assert "decode step, batch 1, context 512" not in result  # no step given
    assert any("host copy 64 MiB" in line for line in pe.lines(result, 40.0))
