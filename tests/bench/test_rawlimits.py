"""The raw limits: each meter moves real bytes (tiny sizes, tiny windows), leaves nothing behind."""
from __future__ import annotations

import os
import threading
import time

import pytest

from bench import rawlimits

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

WINDOW_S = 0.05
SIZE, WORKING_SET = 16 << 10, 64 << 10


def test_pwrite_fsync_writes_every_piece_of_the_working_set(tmp_path):
    with rawlimits.PwriteFsync(SIZE, tmp_path, WORKING_SET) as meter:
        assert meter.window(WINDOW_S) > 0
        for _ in range(100):  # a slow fsync may write fewer pieces than the working set in one window
            if os.path.getsize(meter.path) >= WORKING_SET:
                break
            meter.window(WINDOW_S)
        data = open(meter.path, "rb").read()
        assert data == rawlimits.payload(WORKING_SET).tobytes()  # each piece at its own offset
    assert list(tmp_path.iterdir()) == []  # the temp dir is removed


@pytest.mark.parametrize("threads", [1, 3])
def test_pread_cached_reads_the_file_into_its_places(tmp_path, threads):
    with rawlimits.PreadCached(SIZE, tmp_path, WORKING_SET, threads) as meter:
        assert meter.window(WINDOW_S) > 0
        assert bytes(meter._view) == rawlimits.payload(WORKING_SET).tobytes()
    assert list(tmp_path.iterdir()) == []


def test_steps_run_on_every_thread_for_the_window():
    seen, lock = set(), threading.Lock()

    def step():
        with lock:
            seen.add(threading.get_ident())
        time.sleep(0.001)

    rate = rawlimits.steps_per_s(step, 0.1, threads=3)
    assert len(seen) == 3 and 3 * 50 < rate < 3 * 1000  # three threads of one step per ms or more


def test_a_zmq_meter_sends_only_during_its_windows():
    import zmq

    with rawlimits.ZmqLoopback(SIZE, WORKING_SET) as meter:
        child = meter._child
        for _ in range(2):
            assert meter.window(WINDOW_S) > 0
            # paused between windows: nothing arrives that would take CPU from a transfer
            assert not meter._pull.poll(300, zmq.POLLIN)
    assert child.poll() is not None  # the sender has exited


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


def test_path_meters_and_the_put_and_get_limits(tmp_path):
    with rawlimits.path_meters(SIZE, tmp_path, WORKING_SET) as meters:
        sampler = rawlimits.Sampler(meters, WINDOW_S)
        sampler()
    best = sampler.best()
    assert set(best) == {"zmq_tcp", "pwrite_fsync", "pread_cached"} and all(v > 0 for v in best.values())
    assert list(tmp_path.iterdir()) == []
    assert rawlimits.put_get_limits({"zmq_tcp": 5.0, "pwrite_fsync": 2.0, "pread_cached": 9.0}) == \
        {"put": 2.0, "get": 5.0}
