"""Freed memory goes back to the system once the fabric is idle after refusing unauthenticated work: one
trim per burst, none while busy, none for the hosts' own traffic."""
from __future__ import annotations

import pytest

from storage_node.idle_trim import IdleTrim, _malloc_trim

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_it_trims_once_per_burst_after_the_idle_time():
    calls = []
    t = IdleTrim(idle_s=2.0, trim=calls.append)
    assert not t.tick(100.0)  # nothing arrived yet
    t.seen(100.0)
    assert not t.tick(105.0)  # the hosts' own traffic: their buffers keep their pages
    t.seen(106.0)
    t.want()
    assert not t.tick(107.0)  # still busy
    assert t.tick(108.5) and calls == [0]
    assert not t.tick(110.0)  # once per burst
    t.seen(111.0)
    t.want()
    assert t.tick(113.0) and t.trims == 2


def test_malloc_trim_is_found_on_this_system():
    trim = _malloc_trim()
    assert trim is not None and trim(0) in (0, 1)
