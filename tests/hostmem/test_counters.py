import threading
import time

from hostmem.counters import wait_counter


def test_wait_counter_sees_a_store_and_times_out():
    value = [0]
    threading.Timer(0.02, lambda: value.__setitem__(0, 3)).start()
    start = time.perf_counter()
    assert wait_counter(lambda: value[0], 3, timeout_s=2.0)
    assert time.perf_counter() - start < 1.0
    assert not wait_counter(lambda: 0, 1, timeout_s=0.02)
