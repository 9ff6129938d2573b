"""What a finished restore covers (pure)."""
from __future__ import annotations


import numpy as np

from compute_node import restore as rs

IDS = np.arange(100, 200, dtype=np.uint32)


def test_matching_ids_cover_the_announced_prefix():
    out = rs.decide(64, 0, IDS[:64].copy(), IDS, 1000)
    assert (out.covered, out.reason, out.bytes_restored) == (64, "", 1000)


def test_at_least_one_token_is_left_to_prefill():
    out = rs.decide(100, 0, IDS.copy(), IDS, 1000)
    assert out.covered == 99


def test_errors_mean_nothing_is_reused():
    out = rs.decide(64, 1, IDS[:64].copy(), IDS, 1000)
    assert out.covered == 0 and "1 chunk(s) ended with an error" in out.reason


def test_different_ids_mean_nothing_is_reused():
    restored = IDS[:64].copy()
    restored[40] = 7
    out = rs.decide(64, 0, restored, IDS, 1000)
    assert out.covered == 0 and "position 40" in out.reason


def test_an_announcement_longer_than_the_request_is_refused():
    out = rs.decide(200, 0, IDS.copy(), IDS, 1000)
    assert out.covered == 0 and "more than the request" in out.reason
