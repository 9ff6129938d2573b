"""The benchmarks' compute stand-in: a real child process storing and polling a real region's counters."""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from bench.compute_standin import ComputeStandIn
from hostmem.region import Region

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

SIZE, COUNTERS = 1 << 16, 4
COUNTER_OFFSET = SIZE - 4096
TRIGGER, DONE = 0, 1


@pytest.fixture
def region():
    region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", SIZE, COUNTER_OFFSET, COUNTERS)
    yield region
    region.close()


def _complete_when_triggered(region: Region, value: int, completions: int, gap_s: float) -> threading.Thread:
    """A thread that waits for the trigger store, then adds completions (half as errors) one by one."""
    def run():
        while region.counter_total(TRIGGER) < value:
            time.sleep(0.0005)
        for i in range(completions):
            time.sleep(gap_s)
            region.add_counter(DONE, success=i % 2, error=1 - i % 2)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_fire_stores_the_trigger_and_times_until_the_completion_total(region):
    with ComputeStandIn(region, COUNTER_OFFSET) as compute:
        worker = _complete_when_triggered(region, 3, completions=4, gap_s=0.02)
        seconds = compute.fire(TRIGGER, 3, DONE, total=4)
        worker.join()
        assert region.read_counter(TRIGGER) == (3, 0)
        assert 0.08 <= seconds < 2.0  # four gaps of 20 ms; errors count towards the total

        worker = _complete_when_triggered(region, 5, completions=2, gap_s=0.0)
        assert compute.fire(TRIGGER, 5, DONE, total=6) < 2.0  # the same process serves the next round
        worker.join()


def test_a_completion_that_never_comes_is_a_timeout_not_a_hang(region):
    with ComputeStandIn(region, COUNTER_OFFSET) as compute:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="counter 1 stuck at"):
            compute.fire(TRIGGER, 1, DONE, total=1, timeout_s=0.2)
        assert time.monotonic() - start < 5.0
        region.add_counter(DONE, success=1)
        assert compute.fire(TRIGGER, 2, DONE, total=1) < 1.0  # and it goes on serving


def test_close_ends_the_child_process(region):
    compute = ComputeStandIn(region, COUNTER_OFFSET)
    process = compute._proc
    assert process.is_alive()
    compute.close()
    assert not process.is_alive() and process.exitcode == 0


def test_a_stand_in_that_cannot_start_is_reported_as_exited():
    gone = Region.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", SIZE, COUNTER_OFFSET, COUNTERS)
    gone.close()  # its shared memory is unlinked: the child cannot attach it
    with pytest.raises(RuntimeError, match=r"the compute stand-in exited \(code 1\)"):
        ComputeStandIn(gone, COUNTER_OFFSET)
