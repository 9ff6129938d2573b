"""One suite over every eviction policy, with an injected clock."""
from __future__ import annotations

import pytest

from smartnic.eviction import Combined, IdleTimer, LruCapacity, make_policy

MB = 1 << 20


class Clock:
    def __init__(self):
        self.now = 1000.0


def lru():
    policy = LruCapacity(high_bytes=10 * MB, low_bytes=6 * MB)

    def pressure(policy, clock):  # a new 6 MB context passes the high watermark
        policy.touch("newcomer", 6 * MB, clock.now)
    return policy, pressure, "capacity"


def timer():
    policy = IdleTimer(ttl_s=60)

    def pressure(policy, clock):  # a minute passes; the newcomer is fresh
        clock.now += 61
        policy.touch("newcomer", 6 * MB, clock.now)
    return policy, pressure, "ttl"


def both():
    policy, _, _ = lru()
    combined = Combined([policy, IdleTimer(ttl_s=60)])
    return combined, lru()[1], "capacity"


@pytest.fixture(params=[lru, timer, both], ids=["lru", "timer", "both"])
def case(request):
    return request.param()


def fill(policy, clock):
    for name in ("a", "b", "c"):
        policy.touch(name, 2 * MB, clock.now)
        clock.now += 1


def test_nothing_evicted_without_pressure(case):
    policy, _, _ = case
    clock = Clock()
    fill(policy, clock)
    assert policy.victims(clock.now) == []


def test_least_recently_used_goes_first_with_reason(case):
    policy, pressure, reason = case
    clock = Clock()
    fill(policy, clock)
    policy.touch("a", 2 * MB, clock.now)  # a is now the most recent
    pressure(policy, clock)
    victims = policy.victims(clock.now)
    assert victims and victims[0] == ("b", reason)
    assert "newcomer" not in [k for k, _ in victims]
    assert policy.victims(clock.now) == []  # forgotten once named


def test_leased_context_is_never_evicted(case):
    policy, pressure, _ = case
    clock = Clock()
    fill(policy, clock)
    pressure(policy, clock)
    victims = policy.victims(clock.now, leased=lambda key: key == "a")
    assert "a" not in [k for k, _ in victims] and victims


def test_removed_context_is_not_named(case):
    policy, pressure, _ = case
    clock = Clock()
    fill(policy, clock)
    for name in ("a", "b", "c"):
        policy.remove(name)
    pressure(policy, clock)
    assert policy.victims(clock.now) == []


def test_lru_stops_at_the_low_watermark():
    policy, pressure, _ = lru()
    clock = Clock()
    fill(policy, clock)
    pressure(policy, clock)  # 12 MB > 10 MB: evict down to <= 6 MB
    assert [k for k, _ in policy.victims(clock.now)] == ["a", "b", "c"]
    assert policy.total_bytes == 6 * MB


def test_make_policy():
    assert isinstance(make_policy("lru", 2, 1, 5), LruCapacity)
    assert isinstance(make_policy("timer", 2, 1, 5), IdleTimer)
    assert isinstance(make_policy("both", 2, 1, 5), Combined)
    with pytest.raises(ValueError):
        make_policy("lfu", 2, 1, 5)


def test_over_capacity_says_when_a_pass_would_evict():
    lru, both = LruCapacity(100, 50), make_policy("both", 100, 50, 60.0)
    for p in (lru, both):
        p.touch("a", 100, 0.0)
        assert not p.over_capacity
        p.touch("b", 1, 0.0)
        assert p.over_capacity
        p.victims(0.0)
        assert not p.over_capacity
    assert not make_policy("timer", 1, 0, 1.0).over_capacity
