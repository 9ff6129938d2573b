from __future__ import annotations

import pytest

from smartnic.match_action import (
    DENY,
    FORWARD,
    PREFETCH_KV,
    RATE_LIMIT,
    Action,
    Entry,
    Match,
    Table,
    TableError,
)

PKT = {"user_id": "alice", "context_id": "c1", "src_addr": "10.1.2.3", "src_port": 40000,
       "dst_addr": "127.0.0.1", "dst_port": 50051, "protocol": 6}


def entry(*matches, priority=0, action=DENY, **kw):
    return Entry(tuple(matches), priority, Action(action, **kw))


def test_default_action_on_miss_counts_default_hits():
    table = Table("ingress")
    table.insert(entry(Match("user_id", "exact", "bob")))
    decision = table.lookup(PKT, 0)
    assert decision.action.type == PREFETCH_KV and decision.entry_id == 0 and table.default_hits == 1


def test_highest_priority_wins_then_earliest():
    table = Table("ingress")
    low = table.insert(entry(Match("user_id", "exact", "alice"), priority=1, action=FORWARD))
    high = table.insert(entry(Match("src_addr", "lpm", "10.0.0.0", 8), priority=5, action=DENY))
    same = table.insert(entry(Match("protocol", "ternary", 6, 0xFF), priority=5, action=FORWARD))
    d = table.lookup(PKT, 0)
    assert d.entry_id == high and d.action.type == DENY
    assert table.entries[high].hit_count == 1 and table.entries[low].hit_count == 0
    table.delete(high)
    assert table.lookup(PKT, 0).entry_id == same


def test_context_wildcard_and_exact():
    table = Table("ingress")
    any_ctx = table.insert(entry(Match("user_id", "exact", "alice"), priority=1, action=FORWARD))
    one_ctx = table.insert(entry(Match("user_id", "exact", "alice"), Match("context_id", "exact", "c9"),
                                 priority=2))
    assert table.lookup(PKT, 0).entry_id == any_ctx
    assert table.lookup({**PKT, "context_id": "c9"}, 0).entry_id == one_ctx


def test_lpm_and_ternary_fields():
    table = Table("ingress")
    e = table.insert(
        entry(Match("src_addr", "lpm", "10.1.2.0", 24), Match("dst_port", "ternary", 50000, 0xFF00))
    )
    assert table.lookup(PKT, 0).entry_id == e  # 50051 & 0xFF00 == 50000 & 0xFF00
    assert table.lookup({**PKT, "src_addr": "10.1.3.1"}, 0).entry_id == 0
    v6 = table.insert(entry(Match("src_addr", "lpm", "::1", 128), priority=3))
    assert table.lookup({**PKT, "src_addr": "::1"}, 0).entry_id == v6
    d = table.insert(entry(Match("dst_addr", "ternary", "127.0.0.0", 0xFF000000), priority=9))
    assert table.lookup(PKT, 0).entry_id == d


def test_modify_keeps_hits_and_rate_limit_bucket():
    table = Table("ingress")
    eid = table.insert(entry(Match("user_id", "exact", "alice"), action=RATE_LIMIT, rate_per_s=1, burst=2))
    results = [table.lookup(PKT, 100.0).over_limit for _ in range(3)]
    assert results == [False, False, True]
    assert not table.lookup(PKT, 101.0).over_limit
    table.modify(Entry((Match("user_id", "exact", "alice"),), 0, Action(FORWARD), entry_id=eid))
    assert table.entries[eid].hit_count == 4 and not table.lookup(PKT, 101.0).over_limit


def test_bad_entries_are_refused():
    with pytest.raises(TableError):
        Match("user_id", "lpm", "x", 1)
    with pytest.raises(TableError):
        Match("colour", "exact", "red")
    with pytest.raises(TableError):
        Action("DROP")
    with pytest.raises(TableError):
        Table("t").delete(42)
