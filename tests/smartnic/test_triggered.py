from __future__ import annotations

import pytest

from smartnic.triggered import DeferredWorkQueue, QueueFull, progress


class Counters(dict):
    """Counters as (success, error) by name; total is what thresholds compare with."""

    def total(self, name):
        s, e = self.get(name, (0, 0))
        return s + e

    def add(self, name, success=0, error=0):
        s, e = self.get(name, (0, 0))
        self[name] = (s + success, e + error)


def run(dwq, counters, log):
    def fire(entry):
        log.append(entry.op)
        kind, *args = entry.op
        if kind == "add":
            counters.add(args[0], args[1])
        elif kind == "set":
            counters[args[0]] = (args[1], counters.get(args[0], (0, 0))[1])
        if entry.completion:
            counters.add(entry.completion, 1)
    return progress(dwq, counters.total, fire)


def test_fires_at_once_when_threshold_already_met():
    dwq, c, log = DeferredWorkQueue(), Counters(t=(5, 0)), []
    dwq.queue([("t", 5, ("put", "a"), "done"), ("t", 6, ("put", "b"), "done")])
    assert run(dwq, c, log) == 1 and log == [("put", "a")] and c.total("done") == 1
    assert len(dwq) == 1


def test_increment_larger_than_one_fires_everything_passed_in_threshold_order():
    dwq, c, log = DeferredWorkQueue(), Counters(), []
    dwq.queue([("t", 96, ("put", 3), None), ("t", 32, ("put", 1), None), ("t", 64, ("put", 2), None),
               ("t", 128, ("put", 4), None)])
    assert run(dwq, c, log) == 0
    c["t"] = (100, 0)
    assert run(dwq, c, log) == 3 and log == [("put", 1), ("put", 2), ("put", 3)]


def test_equal_thresholds_fire_in_queue_order():
    dwq, c, log = DeferredWorkQueue(), Counters(), []
    dwq.queue([("t", 2, ("op", i), None) for i in range(5)])
    dwq.queue([("t", 1, ("op", "first"), None)])
    c["t"] = (2, 0)
    run(dwq, c, log)
    assert log == [("op", "first")] + [("op", i) for i in range(5)]


def test_error_part_counts_toward_the_threshold():
    dwq, c, log = DeferredWorkQueue(), Counters(t=(1, 0)), []
    dwq.queue([("t", 3, ("put", "x"), None)])
    assert run(dwq, c, log) == 0
    c.add("t", error=2)
    assert run(dwq, c, log) == 1


def test_chaining_through_counter_ops():
    dwq, c, log = DeferredWorkQueue(), Counters(), []
    dwq.queue([("a", 1, ("add", "b", 1), None), ("b", 1, ("set", "c", 10), None),
               ("c", 10, ("put", "end"), "done")])
    c["a"] = (1, 0)
    assert run(dwq, c, log) == 3
    assert log == [("add", "b", 1), ("set", "c", 10), ("put", "end")] and c.total("done") == 1


def test_cancel_by_counter_and_flush():
    dwq = DeferredWorkQueue()
    dwq.queue([("a", 1, "x", None), ("a", 2, "y", None), ("b", 1, "z", None), (("r2", 0), 1, "w", None)])
    assert dwq.cancel("a") == 2 and len(dwq) == 2
    assert dwq.cancel("a") == 0
    assert dwq.flush(lambda t: isinstance(t, tuple)) == 1
    assert dwq.flush() == 1 and len(dwq) == 0 and dwq.triggers() == []


def test_bound_refuses_all_or_none():
    dwq = DeferredWorkQueue(bound=4)
    dwq.queue([("a", i, i, None) for i in range(3)])
    with pytest.raises(QueueFull):
        dwq.queue([("a", 9, 9, None), ("a", 10, 10, None)])
    assert len(dwq) == 3
    dwq.queue([("a", 9, 9, None)])
    assert len(dwq) == 4
    assert len(dwq.pop_due("a", 100)) == 4 and len(dwq) == 0


def test_default_bound_is_512():
    dwq = DeferredWorkQueue()
    dwq.queue([("a", 1, i, None) for i in range(512)])
    with pytest.raises(QueueFull):
        dwq.queue([("a", 1, "one more", None)])
