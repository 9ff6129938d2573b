"""The triggered engine's watcher thread on a real region, with a fake data path (no processes)."""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import uuid

import pytest

from hostmem.bell import SLEEPING, Bell
from hostmem.kv_layout import KvLayout
from hostmem.layout_proto import layout_to_proto
from smartnic import standing
from smartnic.datapath import ChunkRef
from smartnic.watcher import (TIMER_SLACK_NS, CounterWork, DataWork, TriggerEngine, WatcherSettings, fine_timer_slack,
                              realtime)
from hostmem.region import Region, RegionError
from smartnic.registrations import Registrations
from smartnic.settings import SmartNicSettings
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


POOL = KvLayout(num_blocks=6, num_layers=1, num_kv_heads=1, block_tokens=4, head_dim=2)


@pytest.fixture(params=["python", pytest.param("compiled", marks=pytest.mark.skipif(
        standing._poller is None, reason="the compiled poller was not built"))])
def pool_engine(request):
    """A watcher over one registered pool whose standing PUTs go to `answers` (block -> what the
    agent's block_put would answer: a stamp, None for refused, or an exception to raise); the pool
    polled from Python or by a compiled poller."""
    region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", POOL.region_bytes, POOL.counter_offset,
                           POOL.counter_count)
    regions = Registrations()
    answers, fired, timed = {}, [], []

    def fire(reg, block, generation):
        fired.append((block, generation))
        answer = answers.get(block, 0)
        if isinstance(answer, Exception):
            raise answer
        return answer() if callable(answer) else answer

    eng = TriggerEngine(regions, Stats(), lambda *a: None,
                        WatcherSettings(spin_s=0, poll_s=50e-6, warm_s=0.01, max_sleep_s=0.002,
                                        compiled=request.param == "compiled"), fire_block=fire)
    eng.on_block_fire.append(lambda reg, block, gen, store_ns, fire_ns: timed.append((block, gen, store_ns, fire_ns)))
    eng.start()
    yield eng, regions, region, answers, fired, timed
    eng.stop()
    regions.close()
    region.close()


def test_standing_puts_fire_once_per_store_and_are_timed_from_the_store(pool_engine):
    eng, regions, region, answers, fired, timed = pool_engine
    time.sleep(0.05)  # nothing registered: the watcher sleeps until a registration wakes it
    reg = regions.register(region.name, POOL.region_bytes, "k", POOL.counter_offset, POOL.counter_count,
                           layout_to_proto(POOL))
    eng.wake()
    answers.update({0: lambda: time.monotonic_ns() - 1_000_000,  # stamped 1 ms before the store was seen
                    1: None, 2: RuntimeError("a bug"), 3: 0,   # refused; failed; not stamped
                    4: lambda: time.monotonic_ns() + 10**9})   # a stamp that cannot be this store's
    before = time.monotonic_ns()
    for block in range(5):
        region.store_counter(POOL.put_trigger(block), 1)
    deadline = time.monotonic() + 5
    while len(fired) < 5 or len(timed) < 3:
        assert time.monotonic() < deadline, (fired, timed)
        time.sleep(0.001)
    assert sorted(fired) == [(b, 1) for b in range(5)]
    assert wait(region, POOL.put_done(2), 1) == (0, 1)  # the failed fire ends on its PUT-done error part
    assert region.read_counter(POOL.put_done(1)) == (0, 0)  # a refusal's counter is block_put's to bump
    by_block = {block: (store_ns, fire_ns) for block, _, store_ns, fire_ns in timed}
    assert sorted(by_block) == [0, 3, 4]  # neither the refused nor the failed PUT is a trigger-to-fire sample
    assert by_block[0][1] - by_block[0][0] >= 1_000_000  # from the stamp
    for block in (3, 4):  # no usable stamp: from when the watcher saw the store
        assert before <= by_block[block][0] <= by_block[block][1]
    assert eng.stats.snapshot()[0]["triggered_fired"] == 5
    p50, p99 = eng.stats.percentiles()
    assert p99 >= 950 and p50 > 0  # one sample of three from 1 ms back
    time.sleep(0.1)  # past warm_s: the watcher has backed off to its longest sleep, and still fires
    region.store_counter(POOL.put_trigger(5), 1)
    while (5, 1) not in fired:
        assert time.monotonic() < deadline + 5, fired
        time.sleep(0.001)
    assert fired.count((5, 1)) == 1 and reg.standing is not None
    compiled = eng.compiled and standing._poller is not None
    assert (reg.standing.poller is not None) == compiled
    poller = reg.standing.poller
    regions.deregister(reg.region_id, "k")  # the poller lets go of the region first (the watcher may wait in it)
    assert reg.standing.poller is None and (poller is None or poller.closed)


def test_a_fine_timer_slack_is_the_calling_threads_alone():
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux only")
    prctl = ctypes.CDLL(None).prctl  # PR_GET_TIMERSLACK (30) answers for the calling thread
    seen = {}

    def watcher_like():
        seen["set"] = fine_timer_slack()
        seen["slack"] = prctl(30, 0, 0, 0, 0)
    thread = threading.Thread(target=watcher_like)
    thread.start()
    thread.join()
    assert seen == {"set": True, "slack": TIMER_SLACK_NS}
    assert prctl(30, 0, 0, 0, 0) != TIMER_SLACK_NS  # this thread keeps its own


def test_real_time_scheduling_is_the_watcher_threads_alone_where_permitted():
    if not hasattr(os, "sched_setscheduler"):
        pytest.skip("no sched_setscheduler here")
    seen = {}

    def watcher_like():
        seen["granted"] = realtime()
        seen["policy"] = os.sched_getscheduler(0)
    thread = threading.Thread(target=watcher_like)
    thread.start()
    thread.join()
    assert seen["policy"] == (os.SCHED_FIFO if seen["granted"] else os.SCHED_OTHER)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # this thread is left as it was


@pytest.mark.skipif(standing._poller is None, reason="the compiled poller was not built")
def test_the_watcher_sleeps_on_the_doorbell_and_a_registration_ends_its_wait():
    regions, fired = Registrations(), []
    eng = TriggerEngine(regions, Stats(), lambda *a: None,
                        WatcherSettings(spin_s=0, poll_s=50e-6, warm_s=0.01, max_sleep_s=0.002, bell_timeout_s=30.0),
                        fire_block=lambda reg, b, g: fired.append((reg.region_id, b, g)))
    pools = [Region.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", POOL.region_bytes, POOL.counter_offset,
                           POOL.counter_count) for _ in range(2)]
    eng.start()
    try:
        first = regions.register(pools[0].name, POOL.region_bytes, "k", POOL.counter_offset, POOL.counter_count,
                                 layout_to_proto(POOL))
        eng.wake()
        bell, deadline = Bell(POOL, pools[0].counters), time.monotonic() + 10
        while bell.word[0] != SLEEPING:  # one pool, nothing else: it sleeps on the pool's doorbell
            assert time.monotonic() < deadline
            time.sleep(0.001)
        pools[0].store_counter(POOL.put_trigger(1), 1)
        assert bell.ring()  # the compute node's side: woken, not after the 30 s timeout
        while (first.region_id, 1, 1) not in fired:
            assert time.monotonic() < deadline, fired
            time.sleep(0.001)
        assert first.standing.poller.rings >= 1
        second = regions.register(pools[1].name, POOL.region_bytes, "k", POOL.counter_offset, POOL.counter_count,
                                  layout_to_proto(POOL))
        eng.wake()  # two pools: the wait ends, and the watcher polls both (no doorbell rung below)
        pools[1].store_counter(POOL.put_trigger(2), 1)
        while (second.region_id, 2, 1) not in fired:
            assert time.monotonic() < deadline, fired
            time.sleep(0.001)
    finally:
        eng.stop()
        regions.close()
        for region in pools:
            region.close()


@pytest.mark.skipif(standing._poller is None, reason="the compiled poller was not built")
def test_a_napping_watcher_finds_the_stores_after_a_fire_with_its_doorbell_awake():
    settings = SmartNicSettings(watcher_nap_us=500, watcher_nap_warm_ms=30_000, watcher_bell_timeout_ms=30_000)
    with pytest.raises(Exception, match="not negative"):  # a negative nap would make every wait refuse at once
        SmartNicSettings(watcher_nap_us=-1)
    watch = WatcherSettings.of(settings)
    assert (watch.nap_s, watch.nap_warm_s) == (500e-6, 30.0)
    regions, fired = Registrations(), []
    eng = TriggerEngine(regions, Stats(), lambda *a: None, watch, fire_block=lambda reg, b, g: fired.append((b, g)))
    pool = Region.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", POOL.region_bytes, POOL.counter_offset, POOL.counter_count)
    eng.start()
    try:
        reg = regions.register(pool.name, POOL.region_bytes, "k", POOL.counter_offset, POOL.counter_count,
                               layout_to_proto(POOL))
        eng.wake()
        bell, deadline = Bell(POOL, pool.counters), time.monotonic() + 10
        while bell.word[0] != SLEEPING:  # cold: nothing fired yet, it sleeps on the doorbell
            assert time.monotonic() < deadline
            time.sleep(0.001)
        pool.store_counter(POOL.put_trigger(1), 1)
        assert bell.ring()
        for generation in (1, 2, 3):  # warm from the first fire on: each store found by a nap, none rung
            if generation > 1:
                time.sleep(0.02)
                assert bell.word[0] != SLEEPING
                pool.store_counter(POOL.put_trigger(1), generation)
                assert not bell.ring()
            while (1, generation) not in fired:
                assert time.monotonic() < deadline, fired
                time.sleep(0.001)
        assert reg.standing.poller.rings == 1 and reg.standing.poller.naps > 0
    finally:
        eng.stop()
        regions.close()
        pool.close()
