"""Smoke tests: each raw limit with a tiny size and a tiny budget returns a positive rate."""
from __future__ import annotations

import pytest

from kvtb.bench import rawlimits

BUDGET_S = 0.05


def test_memcpy():
    assert rawlimits.memcpy_bytes_per_s(64 << 10, BUDGET_S) > 0


def test_pwrite_fsync(tmp_path):
    assert rawlimits.pwrite_fsync_bytes_per_s(64 << 10, BUDGET_S, tmp_path) > 0
    assert list(tmp_path.iterdir()) == []  # the temp dir is removed


def test_pread_cached(tmp_path):
    assert rawlimits.pread_cached_bytes_per_s(64 << 10, BUDGET_S, tmp_path) > 0


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_zmq(transport):
    assert rawlimits.zmq_bytes_per_s(transport, 16 << 10, BUDGET_S) > 0


def test_zmq_rejects_unknown_transport():
    with pytest.raises(ValueError):
        rawlimits.zmq_bytes_per_s("udp", 1024, BUDGET_S)


def test_measure_all_keys(tmp_path):
    limits = rawlimits.measure_all(32 << 10, 8 << 10, 0.02, tmp_path)
    assert set(limits) == {"memcpy", "pwrite_fsync", "pread_cached", "zmq_tcp", "zmq_ipc"}
    assert all(v > 0 for v in limits.values())
