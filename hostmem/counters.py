"""Waiting on a counter of a registered region (the fi_cntr_wait of the design), without a syscall.

A short spin, then sleeps that grow to 1 ms: the waiter reads the shared counter directly, as a
GPU thread polls a flag, so nothing is sent to the agent.
"""
from __future__ import annotations

import time
from typing import Callable


def wait_counter(total: Callable[[], int], threshold: int, timeout_s: float,
                 spin_s: float = 0.0005) -> bool:
    """Wait until total() >= threshold; False after timeout_s."""
    start = time.perf_counter()
    deadline = start + timeout_s
    sleep = 0.00005
    while True:
        if total() >= threshold:
            return True
        now = time.perf_counter()
        if now >= deadline:
            return False
        if now - start > spin_s:
            time.sleep(min(sleep, deadline - now))
            sleep = min(sleep * 2, 0.001)
