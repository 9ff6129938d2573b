"""Standing triggered PUTs: armed once, fired by a counter store, re-armed by themselves; polled from
Python or by the compiled poller thread (the same cases for both)."""
import threading
import time

import numpy as np
import pytest

from hostmem.bell import AWAKE, SLEEPING, Bell
from hostmem.kv_layout import KvLayout
from smartnic import standing
from smartnic.standing import StandingPuts

L = KvLayout(num_blocks=5, num_layers=2, num_kv_heads=1, block_tokens=4, head_dim=2)
needs_poller = pytest.mark.skipif(standing._poller is None, reason="the compiled poller was not built")


def due(puts: StandingPuts) -> list[tuple[int, int]]:
    """(block, generation) of every entry that fired since the last call (its seen time aside)."""
    return [(block, generation) for block, generation, _ in puts.fired()]


@pytest.fixture(params=["python", pytest.param("compiled", marks=needs_poller)])
def make_puts(request):
    made = []

    def make(counters: np.ndarray) -> StandingPuts:
        puts = StandingPuts(L, counters)
        if request.param == "compiled":
            assert puts.start_compiled() and puts.poller is not None
        made.append(puts)
        return puts
    yield make
    for puts in made:
        puts.close()


def test_a_store_fires_its_block_once_and_the_entry_rearms_itself(make_puts):
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    counters[L.put_trigger(1), 0] = 3  # generations stored before this agent armed: not due
    puts = make_puts(counters)
    assert len(puts) == 5 and due(puts) == []
    counters[L.put_trigger(1), 0] = 4
    counters[L.put_trigger(4), 0] = 1
    assert due(puts) == [(1, 4), (4, 1)]
    assert due(puts) == []  # fired once per store
    counters[L.put_trigger(1), 0] = 5
    assert due(puts) == [(1, 5)]


def test_each_new_generation_fires_again_and_nothing_else_does(make_puts):
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts = make_puts(counters)
    for generation in range(1, 6):  # the agent re-arms after every fire: no call from the compute node
        counters[L.put_trigger(2), 0] = generation
        assert due(puts) == [(2, generation)]
        assert due(puts) == []
    counters[L.put_trigger(2), 0] = 3  # a store that goes back is not a new generation
    assert due(puts) == []
    counters[L.put_trigger(2), 0] = 5  # nor one back to where it fired
    assert due(puts) == []
    counters[L.put_trigger(2), 0] = 6
    assert due(puts) == [(2, 6)]
    for block in range(L.num_blocks):  # a whole step's blocks at once
        counters[L.put_trigger(block), 0] += 1
    assert due(puts) == [(0, 1), (1, 1), (2, 7), (3, 1), (4, 1)]


def test_two_stores_between_polls_fire_once_at_the_last_generation():
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts = StandingPuts(L, counters)  # Python's poll, whose timing the test controls
    counters[L.put_trigger(0), 0] = 2
    counters[L.put_trigger(0), 0] = 3
    assert due(puts) == [(0, 3)]


def test_other_counters_of_a_block_never_fire_it(make_puts):
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts = make_puts(counters)
    counters[L.put_done(1), 0] = 9
    counters[L.get_done(1), 0] = 9
    counters[L.extra_counter(0), 0] = 9
    counters[L.put_trigger(1), 1] = 9  # the error part of a trigger is the agent's, not a store
    assert due(puts) == []


@needs_poller
def test_the_compiled_poller_takes_over_the_arming():
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts = StandingPuts(L, counters)
    counters[L.put_trigger(3), 0] = 1
    assert due(puts) == [(3, 1)]  # fired from Python: armed at 1
    counters[L.put_trigger(2), 0] = 1  # stored after Python's last poll, before the poller took over
    assert puts.start_compiled() and puts.start_compiled()  # once
    before = time.monotonic_ns()
    fired = puts.fired()
    assert [f[:2] for f in fired] == [(2, 1)] and before <= fired[0][2] <= time.monotonic_ns()  # not lost
    assert puts.fired() == []  # block 3's arming carried over
    puts.close()
    counters[L.put_trigger(3), 0] = 2
    assert due(puts) == [] and puts.poller is None  # closed: nothing fires any more


def _compiled_with_bell():
    """Counters, their standing PUTs polled by the compiled poller, and the compute node's doorbell."""
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts, bell = StandingPuts(L, counters), Bell(L, counters)
    assert puts.start_compiled()
    return counters, puts, bell


@needs_poller
def test_a_wait_sleeps_on_the_doorbell_until_the_compute_node_rings_it():
    counters, puts, bell = _compiled_with_bell()
    poller = puts.poller
    start = time.monotonic()
    assert puts.wait(0.0, 0.02) == [] and time.monotonic() - start >= 0.015  # nothing: the timeout
    assert bell.ring() is False and poller.rings == 0  # awake again: nothing to ring

    def compute_node():
        while bell.word[0] != SLEEPING:  # the watcher said it sleeps
            time.sleep(0.0005)
        counters[L.put_trigger(4), 0] = 1
        assert bell.ring()
    thread = threading.Thread(target=compute_node)
    thread.start()
    start = time.monotonic()
    fired = puts.wait(0.0, 10.0)  # rung long before the timeout
    thread.join()
    assert [f[:2] for f in fired] == [(4, 1)] and time.monotonic() - start < 5
    assert poller.rings == 1 and bell.rings == 1 and bell.word[0] == AWAKE

    def interrupter():
        while bell.word[0] != SLEEPING:
            time.sleep(0.0005)
        puts.interrupt()
    thread = threading.Thread(target=interrupter)
    thread.start()
    start = time.monotonic()
    assert puts.wait(0.0, 10.0) == [] and time.monotonic() - start < 5  # interrupted: ends with nothing
    thread.join()
    counters[L.put_trigger(0), 0] = 1
    assert [f[:2] for f in puts.wait(0.001, 10.0)] == [(0, 1)]  # a store before the wait: found spinning
    puts.close()
    assert poller.closed


@needs_poller
def test_a_warm_wait_naps_with_the_doorbell_awake_so_a_store_rings_no_one():
    counters, puts, bell = _compiled_with_bell()
    poller = puts.poller
    counters[L.put_trigger(1), 0] = 1
    assert [f[:2] for f in puts.wait(0.0, 1.0, 0.0005, 5.0)] == [(1, 1)]  # a fire: warm from now on
    awake = []

    def compute_node():
        time.sleep(0.02)  # the watcher naps meanwhile
        awake.append(bell.word[0])
        counters[L.put_trigger(2), 0] = 1
        awake.append(bell.ring())
    thread = threading.Thread(target=compute_node)
    thread.start()
    start = time.monotonic()
    fired = puts.wait(0.0, 10.0, 0.0005, 5.0)
    thread.join()
    assert [f[:2] for f in fired] == [(2, 1)] and time.monotonic() - start < 5
    assert awake == [AWAKE, False] and bell.rings == 0 and poller.naps > 0  # found by a nap, no wake-up
    sleeps = poller.sleeps
    time.sleep(0.06)
    assert puts.wait(0.0, 0.02, 0.0005, 0.05) == []  # cold again (50 ms after the fire): the doorbell
    assert poller.sleeps == sleeps + 1
    with pytest.raises(ValueError, match="nap_ns"):
        poller.wait(0, 1000, -1, 0)
    puts.close()


@needs_poller
def test_close_waits_for_a_wait_to_end():
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    puts = StandingPuts(L, counters)
    assert puts.start_compiled()
    poller, out = puts.poller, []
    thread = threading.Thread(target=lambda: out.append(puts.wait(0.0, 10.0)))
    thread.start()
    time.sleep(0.02)
    with pytest.raises(RuntimeError, match="waiting"):
        poller.close()
    start = time.monotonic()
    puts.close()  # interrupts it, then releases the buffer
    thread.join()
    assert poller.closed and out == [[]] and time.monotonic() - start < 5
    with pytest.raises(ValueError, match="closed"):
        poller.poll()


@needs_poller
def test_the_compiled_poller_refuses_what_lies_outside_its_buffer():
    counters = np.zeros((L.counter_count, 2), dtype=np.uint64)
    stride = 16 * L.counters_per_block
    with pytest.raises(ValueError, match="pass the buffer"):
        standing._poller.Poller(counters, 0, stride, L.num_blocks * 10)
    with pytest.raises(ValueError, match="pass the buffer"):
        standing._poller.Poller(counters, 0, stride, L.num_blocks, counters.nbytes)
    with pytest.raises(ValueError, match="armed must hold"):
        standing._poller.Poller(counters, 0, stride, L.num_blocks, -1, bytes(8))
    with pytest.raises(ValueError, match="multiples of 8"):
        standing._poller.Poller(counters, 4, 16, 1)
    with pytest.raises(BufferError):
        standing._poller.Poller(counters.tobytes(), 0, stride, L.num_blocks)  # read-only: the bell is written


def test_without_the_compiled_poller_python_polls_and_fires_stay_3_tuples(monkeypatch):
    monkeypatch.setattr(standing, "_poller", None)  # not built: the agent checks descriptors in Python
    region = np.zeros(L.region_bytes, dtype=np.uint8)
    counters = region[L.counter_offset:L.counter_offset + L.counter_count * 16].view(np.uint64).reshape(-1, 2)
    puts = StandingPuts(L, counters, region)
    assert puts.start_compiled(check=True) is False and puts.poller is None and not puts.checking
    counters[L.put_trigger(2), 0] = 1
    assert puts.fired() == [(2, 1, None)]
    puts.close()
