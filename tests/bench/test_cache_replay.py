"""bench.cache_replay: the agent's policies replayed on hand-made traces, and Belady's bound."""
import random

import pytest

from bench import cache_replay as cr
from bench.mooncake import TraceRequest


def one_block(*names, step=1.0):
    """Requests of one looked-up block each, `step` seconds apart."""
    return [cr.Access(i * step, (n,), 1) for i, n in enumerate(names)]


def test_belady_on_the_classic_sequence():
    # a b c a b d a b c at capacity 2: keep a and b throughout (c and d are bypassed): 4 hits, the most
    # any cache of 2 reaches (hitting c at the end needs a, b and c held from t2 to t8)
    trace = one_block(*"abcabdabc")
    b = cr.belady(trace, 2)
    assert b.hits == 4 and b.hits_per_request == [0, 0, 0, 1, 1, 0, 1, 1, 0]
    assert b.lookups == 9 and b.peak_blocks == 2
    lru = cr.replay(trace, "lru", 2)
    assert lru.hits == 0  # LRU always evicts what comes back next
    assert cr.belady(trace, 3).hits == 5 == cr.ideal(trace).hits
    assert cr.belady(trace, 0).hits == 0


def test_belady_bypasses_blocks_never_used_again():
    trace = one_block(*"axyzwa")
    assert cr.belady(trace, 1).hits == 1  # a kept through four one-shot blocks
    assert cr.replay(trace, "lru", 1).hits == 0


def test_lru_evicts_the_least_recently_used_block():
    trace = one_block(*"abacab")
    r = cr.replay(trace, "lru", 2)
    # a, b stored; a hit (b is now the oldest); c evicts b; a hit; b misses and evicts c
    assert r.hits_per_request == [0, 0, 1, 0, 1, 0]
    assert r.evictions == {"capacity": 2} and r.puts == 4 and r.peak_blocks == 2


def test_lru_low_watermark_evicts_down_to_it():
    r = cr.replay(one_block(*"abcd"), "lru", 3, low_blocks=1)
    assert r.evictions == {"capacity": 3}  # past 3 blocks, down to 1
    assert cr.replay(one_block(*"abcda"), "lru", 3, low_blocks=1).hits_per_request[-1] == 0


def test_timer_drops_idle_blocks():
    trace = [cr.Access(0.0, ("a",), 1), cr.Access(5.0, ("b",), 1), cr.Access(12.0, ("a",), 1),
             cr.Access(14.0, ("b",), 1)]
    r = cr.replay(trace, "timer", 0, ttl_s=10.0, pass_s=0)
    assert r.hits_per_request == [0, 0, 0, 1]  # a idle 12 s > 10; b idle 9 s
    assert r.evictions == {"ttl": 1}
    # with a pass every 20 s of trace time, a outlives its TTL until the next pass
    assert cr.replay(trace, "timer", 0, ttl_s=10.0, pass_s=20.0).hits_per_request == [0, 0, 1, 1]


def test_both_evicts_by_capacity_and_by_idle_time():
    trace = [cr.Access(0.0, ("a",), 1), cr.Access(1.0, ("b",), 1), cr.Access(2.0, ("c",), 1),
             cr.Access(3.0, ("b",), 1), cr.Access(30.0, ("c",), 1)]
    r = cr.replay(trace, "both", 2, ttl_s=10.0, pass_s=0)
    assert r.hits_per_request == [0, 0, 0, 1, 0]
    assert r.evictions == {"capacity": 1, "ttl": 2}


def test_on_reuse_admits_a_block_on_its_second_sighting():
    r = cr.replay(one_block(*"aaab"), "on_reuse", 10)
    assert r.hits_per_request == [0, 0, 1, 0]
    assert r.puts == 1 and r.puts_skipped == 2 and r.policy == "lru+on_reuse"


def test_hits_are_a_prefix_and_stop_at_the_lookup_limit():
    trace = [cr.Access(0.0, ("a", "b", "c"), 3), cr.Access(1.0, ("a", "x", "c"), 3),
             cr.Access(2.0, ("a", "b", "c"), 2)]
    r = cr.replay(trace, "lru", 100)
    assert r.hits_per_request == [0, 1, 2] and r.lookups == 8
    assert cr.belady(trace, 100).hits_per_request == [0, 2, 2]  # the bound counts c, present but past a miss


def test_accesses_of_names_the_reply_blocks_fresh():
    reqs = [TraceRequest(0, 70, 10, (1, 2, 3)), TraceRequest(1000, 64, 1, (1, 2))]
    a, b = cr.accesses_of(reqs, 32)
    # 70 input tokens: 2 full blocks, 69 looked up (2 blocks); 79 computed tokens: 3 blocks, the third fresh
    assert a.blocks == (1, 2, -1) and a.lookup == 2 and a.time_s == 0.0
    # 64 tokens: both full blocks stored, one looked up (the last token is computed); the reply fills nothing
    assert b.blocks == (1, 2) and b.lookup == 1 and b.time_s == 1.0
    assert cr.working_set([a, b]) == 3


def random_trace(rng, n=40):
    """Conversations as prefix chains: a follow-up repeats a previous request's blocks."""
    out, prefixes, fresh = [], [], 1000
    for i in range(n):
        if prefixes and rng.random() < 0.5:
            base = list(rng.choice(prefixes))
        else:
            base = []
        new = list(range(fresh, fresh + rng.randint(1, 4)))
        fresh += len(new)
        blocks = tuple(base + new)
        prefixes.append(blocks)
        out.append(cr.Access(float(i), blocks, rng.randint(max(0, len(blocks) - 2), len(blocks))))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_no_policy_beats_belady_nor_the_ideal(seed):
    rng = random.Random(seed)
    trace = random_trace(rng)
    ideal = cr.ideal(trace).hits
    for cap in (1, 3, 8, 20, 200):
        bound = cr.belady(trace, cap).hits
        assert bound <= ideal
        for policy in ("lru", "both", "on_reuse"):
            r = cr.replay(trace, policy, cap, low_blocks=cr.low_of(cap, 0.75), ttl_s=5.0)
            assert r.hits <= bound, (policy, cap)
        timer = cr.replay(trace, "timer", 0, ttl_s=float(cap))  # no capacity: the bound at its peak
        assert timer.hits <= cr.belady(trace, timer.peak_blocks).hits


def test_timer_ttl_for_fits_the_capacity():
    trace = random_trace(random.Random(3), 60)
    m = max(len(a.blocks) for a in trace)  # below one request's blocks no TTL fits (then MIN_TTL_S)
    assert cr.timer_ttl_for(trace, m - 1, pass_s=0) == cr.MIN_TTL_S
    for cap in (m, 2 * m, 4 * m):
        ttl = cr.timer_ttl_for(trace, cap, pass_s=0)
        assert cr.timer_peak(trace, ttl, pass_s=0) <= cap
        r = cr.replay(trace, "timer", cap, ttl_s=ttl, pass_s=0)
        assert r.peak_blocks <= cap
    big = cr.working_set(trace)
    assert cr.replay(trace, "timer", big, ttl_s=cr.timer_ttl_for(trace, big)).hits == cr.ideal(trace).hits


def test_reuse_gaps_and_percentile():
    trace = [cr.Access(0.0, ("a", "b"), 2), cr.Access(3.0, ("a",), 1), cr.Access(10.0, ("a", "b"), 2)]
    assert sorted(cr.reuse_gaps(trace)) == [3.0, 7.0, 10.0]
    assert cr.percentile([1, 2, 3, 4], 0.5) == 2 and cr.percentile([], 0.9) == 0.0


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError):
        cr.replay([], "fifo", 1)
