"""The triggered engine's watcher thread on a real region, with a fake data path (no processes)."""
from __future__ import annotations

import time
import uuid

import pytest

from smartnic.datapath import ChunkRef
from smartnic.watcher import CounterWork, DataWork, TriggerEngine
from hostmem.region import Region, RegionError
from smartnic.registrations import Registrations
from smartnic.stats import Stats

REF = ChunkRef("alice", "c1", 0, 0, 16)


@pytest.fixture
def engine():
    region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", 4096, 0, 8)
    regions = Registrations()
    reg = regions.register(region.name, 4096, "k", 0, 8)
    outcomes: list[str | None] = []
    handled = []

    def handle(reg, entry, done):
        handled.append(entry.op)
        done(outcomes.pop(0) if outcomes else None, "fake")

    eng = TriggerEngine(regions, Stats(), handle)
    eng.start()
    yield eng, reg, region, outcomes, handled
    eng.stop()
    regions.close()
    region.close()


def wait(region: Region, counter: int, total: int) -> tuple[int, int]:
    deadline = time.monotonic() + 5
    while region.counter_total(counter) < total:
        assert time.monotonic() < deadline, region.read_counter(counter)
        time.sleep(0.001)
    return region.read_counter(counter)


def test_store_fires_data_ops_and_bumps_the_completion_counter(engine):
    eng, reg, region, outcomes, handled = engine
    outcomes.extend([None, "timeout"])
    put = DataWork("put", REF, (), (0, 0))
    eng.queue(reg, [(0, 32, put, 1), (0, 64, put, 1)])
    time.sleep(0.01)
    assert handled == [] and eng.depth == 2
    region.store_counter(0, 64)  # one store passes both thresholds
    assert wait(region, 1, 2) == (1, 1)
    assert [e.kind for e in reg.errors] == ["timeout"] and eng.depth == 0
    p50, p99 = eng.stats.percentiles()
    assert 0 < p50 <= p99


def test_due_at_once_and_chained_counter_ops(engine):
    eng, reg, region, _, _ = engine
    region.store_counter(2, 5)
    eng.queue(reg, [(2, 5, CounterWork("add", 3, 1), None), (3, 1, CounterWork("set", 4, 9), None)])
    assert wait(region, 4, 9) == (9, 0) and region.read_counter(3) == (1, 0)


def test_cancel_flush_and_bad_counters(engine):
    eng, reg, region, _, handled = engine
    get = DataWork("get", REF, (), (0, 0))
    eng.queue(reg, [(5, 1, get, 1)] * 3 + [(6, 1, CounterWork("add", 7, 1), None)])
    assert eng.cancel(reg.region_id, 5) == 3 and eng.flush(reg.region_id) == 1
    region.store_counter(5, 1)
    region.store_counter(6, 1)
    time.sleep(0.02)
    assert handled == [] and region.read_counter(7) == (0, 0)
    with pytest.raises(RegionError):
        eng.queue(reg, [(99, 1, CounterWork("add", 0, 1), None)])


def test_cancel_fires_what_is_already_due_and_drops_the_rest(engine):
    """A store followed at once by a cancel: the due entry fired on the NIC before the cancel."""
    eng, reg, region, outcomes, handled = engine
    eng.stop()  # no watcher: only the cancel can notice the store
    put = DataWork("put", REF, (), (0, 0))
    eng.queue(reg, [(0, 16, put, 1), (0, 48, put, 1)])
    region.store_counter(0, 20)
    assert eng.cancel(reg.region_id, 0) == 1
    assert handled == [put] and region.read_counter(1) == (1, 0) and eng.depth == 0
