"""The doorbell coalesces rings, and never loses one: work queued after an answer always rings again."""
from __future__ import annotations

import os
import select
import threading
from collections import deque

from kvtb import doorbell as db


def readable(bell: db.Doorbell) -> bool:
    return bool(select.select([bell.fd], [], [], 0)[0])


def test_a_ring_wakes_the_loop_and_rings_coalesce_until_it_answers():
    bell = db.Doorbell()
    try:
        assert not readable(bell)
        bell.ring()
        bell.ring()
        assert readable(bell)
        bell.answer()
        assert not readable(bell)
        bell.ring()
        assert readable(bell)
    finally:
        bell.close()


def test_a_ring_racing_the_answer_is_not_lost(monkeypatch):
    """A producer rings between the loop's wake-up and its re-arming: its work is drained in this
    pass, and the next producer's ring wakes the loop again."""
    bell, work = db.Doorbell(), deque()
    real_read = os.eventfd_read

    def read_with_a_producer_racing(fd):
        work.append("raced")
        bell.ring()
        return real_read(fd)

    try:
        bell.ring()  # the loop was rung, and wakes
        monkeypatch.setattr(db.os, "eventfd_read", read_with_a_producer_racing)
        bell.answer()
        monkeypatch.setattr(db.os, "eventfd_read", real_read)
        assert list(work) == ["raced"]  # the loop drains after answering: the raced work is seen
        work.clear()
        work.append("next")
        bell.ring()
        assert readable(bell), "the ring after an answer was swallowed: the loop would sleep on work"
    finally:
        bell.close()


def test_many_producers_never_leave_work_unseen():
    """The loop polls without a timeout's help: a lost ring would leave it asleep with work queued."""
    bell, work, lock = db.Doorbell(), deque(), threading.Lock()
    producers, per_producer = 4, 5000
    seen, stalls = [], []

    def produce(p: int) -> None:
        for i in range(per_producer):
            with lock:
                work.append((p, i))
            bell.ring()

    def consume() -> None:
        while len(seen) < producers * per_producer:
            if not select.select([bell.fd], [], [], 2.0)[0]:
                if work:
                    stalls.append(len(work))
                    bell.answer()  # recover, so the test ends; the stall fails it below
                continue
            bell.answer()
            while work:
                seen.append(work.popleft())

    try:
        consumer = threading.Thread(target=consume)
        consumer.start()
        threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        consumer.join(timeout=60)
        assert not consumer.is_alive()
        assert stalls == []
        assert sorted(seen) == [(p, i) for p in range(producers) for i in range(per_producer)]
    finally:
        bell.close()
