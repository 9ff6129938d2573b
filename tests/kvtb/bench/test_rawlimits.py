"""Smoke tests: each raw limit with a tiny size and a tiny budget returns a positive rate."""
from __future__ import annotations

import time

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


def test_a_working_set_streams_through_distinct_pieces(tmp_path):
    assert rawlimits.pwrite_fsync_bytes_per_s(16 << 10, BUDGET_S, tmp_path, 64 << 10, windows=2) > 0
    assert rawlimits.pread_cached_bytes_per_s(16 << 10, BUDGET_S, tmp_path, 64 << 10, windows=2) > 0
    assert rawlimits.zmq_bytes_per_s("tcp", 16 << 10, BUDGET_S, 64 << 10, windows=2) > 0
    assert list(tmp_path.iterdir()) == []


class SlowFirst(rawlimits.Meter):
    """A step whose first call takes 0.15 s and the others 1 ms or more."""

    size_bytes = 1

    def __init__(self):
        self.calls = 0

    def _step(self):
        time.sleep(0.15 if not self.calls else 0.001)
        self.calls += 1


def test_the_best_window_leaves_a_slow_start_out():
    # one window of 0.2 s holds the slow call: at most 1 + 50 steps, 255 steps/s
    assert SlowFirst().best(0.2) < 300
    # two windows of 0.1 s: the second holds only fast steps
    assert SlowFirst().best(0.2, windows=2) > 300


@pytest.mark.parametrize("processes", [1, 2])
def test_a_zmq_meter_sends_only_during_its_windows(processes):
    import zmq

    with rawlimits.ZmqLoopback("tcp", 16 << 10, 64 << 10, processes=processes) as meter:
        for _ in range(2):
            assert meter.window(BUDGET_S) > 0
            # paused between windows: nothing arrives that would take CPU from a transfer
            assert not meter._pull.poll(300, zmq.POLLIN)


def test_a_zmq_meter_between_processes_leaves_no_child_behind():
    meter = rawlimits.ZmqLoopback("tcp", 16 << 10, processes=2)
    child = meter._child
    meter.close()
    assert child.poll() is not None


def test_zmq_rejects_a_third_process_count():
    with pytest.raises(ValueError):
        rawlimits.zmq_bytes_per_s("tcp", 1024, BUDGET_S, processes=3)


class FixedMeter(rawlimits.Meter):
    def __init__(self, rates):
        self.size_bytes, self.rates = 1, iter(rates)

    def window(self, seconds):
        return next(self.rates)


def test_the_sampler_keeps_each_meters_best_window():
    sampler = rawlimits.Sampler({"a": FixedMeter([3.0, 5.0, 4.0]), "b": FixedMeter([2.0, 1.0, 1.5])}, 0.1)
    for _ in range(3):
        sampler()
    assert sampler.samples == {"a": [3.0, 5.0, 4.0], "b": [2.0, 1.0, 1.5]}
    assert sampler.best() == {"a": 5.0, "b": 2.0}


def test_path_meters_measure_zmq_between_processes_and_within_one(tmp_path):
    with rawlimits.path_meters(16 << 10, tmp_path, 64 << 10) as meters:
        sampler = rawlimits.Sampler(meters, BUDGET_S)
        sampler()
        sampler()
    limits = sampler.best()
    assert set(limits) == {"zmq_tcp", "zmq_tcp_one_process", "pread_cached", "pwrite_fsync"}
    assert all(len(rates) == 2 for rates in sampler.samples.values())
    assert all(v > 0 for v in limits.values())
    assert list(tmp_path.iterdir()) == []
