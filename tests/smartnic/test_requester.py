from __future__ import annotations

import pytest

from fabric.chunk_format import token_ids_hash
from smartnic.requester import Chunk, NotOwner, Requester

IDS = list(range(100, 200))


def chunk(index, start, end, ids=IDS, node="s0"):
    return Chunk(index, start, end, node, bytes([index]) * 16, 1000, 7, token_ids_hash(ids[start:end]))


def test_prefix_match_in_chunk_order():
    r = Requester()
    for i, (s, e) in enumerate([(0, 32), (32, 64), (64, 80)]):
        r.publish("alice", "c1", chunk(i, s, e), now=1.0)
    assert [c.chunk_index for c in r.match_prefix("alice", "c1", IDS, now=2.0)] == [0, 1, 2]
    assert [c.chunk_index for c in r.match_prefix("alice", "c1", IDS[:70], now=2.0)] == [0, 1]
    diverged = IDS[:40] + [0] * 60
    assert [c.chunk_index for c in r.match_prefix("alice", "c1", diverged, now=2.0)] == [0]
    assert r.get("alice", "c1").last_use == 2.0


def test_gap_stops_the_prefix_and_partial_chunk_is_replaced():
    r = Requester()
    r.publish("alice", "c1", chunk(0, 0, 32), 1.0)
    r.publish("alice", "c1", chunk(1, 32, 40), 1.0)
    old = r.publish("alice", "c1", chunk(1, 32, 64), 2.0)
    assert old.token_end == 40 and r.get("alice", "c1").chunks[1].token_end == 64
    r.publish("alice", "c1", chunk(3, 96, 100), 2.0)
    assert len(r.match_prefix("alice", "c1", IDS, 3.0)) == 2
    r.drop_chunk("alice", "c1", 0)
    assert r.match_prefix("alice", "c1", IDS, 3.0) == []


def test_another_users_context_is_refused():
    r = Requester()
    r.publish("alice", "c1", chunk(0, 0, 32), 1.0)
    with pytest.raises(NotOwner):
        r.match_prefix("mallory", "c1", IDS, 2.0)
    with pytest.raises(NotOwner):
        r.publish("mallory", "c1", chunk(1, 32, 64), 2.0)
    assert r.match_prefix("bob", "c2", IDS, 2.0) == []


def test_leases_and_bytes_and_rebuild():
    r = Requester()
    r.publish("alice", "c1", chunk(0, 0, 32), 1.0)
    r.lease("c1")
    assert r.leased("c1")
    r.release("c1")
    assert not r.leased("c1") and r.total_bytes() == 1000
    fresh = Requester()
    loaded = fresh.rebuild([("alice", "c1", chunk(0, 0, 32)), ("alice", "c1", chunk(1, 32, 40)),
                            ("alice", "c1", chunk(1, 32, 64)), ("bob", "c2", chunk(0, 0, 5))], now=5.0)
    assert loaded == 3 and fresh.get("alice", "c1").chunks[1].token_end == 64
    assert {c.context_id for c in fresh.contexts()} == {"c1", "c2"}
    assert [c.context_id for c in fresh.contexts("bob")] == ["c2"]


def test_a_contexts_bytes_follow_every_change_of_its_chunks():
    def sized(index, length, tokens=32):
        return Chunk(index, index * 32, index * 32 + tokens, "s0", bytes([index]) * 16, length, 7, b"")

    def summed(ctx):
        return sum(c.length for c in ctx.chunks.values())

    r = Requester()
    for i, length in enumerate([100, 200, 300]):
        r.publish("alice", "c1", sized(i, length), 1.0)
    ctx = r.get("alice", "c1")
    assert ctx.bytes == summed(ctx) == 600
    r.publish("alice", "c1", sized(1, 250), 2.0)   # replaced by a longer one
    assert ctx.bytes == summed(ctx) == 650
    r.drop_chunk("alice", "c1", 0)
    assert ctx.bytes == summed(ctx) == 550 and r.total_bytes() == 550
    fresh = Requester()
    found = [sized(0, 10, tokens=20), sized(0, 40), sized(1, 5)]  # chunk 0's longer copy wins
    fresh.rebuild([("alice", "c1", c) for c in found], 5.0)
    rebuilt = fresh.get("alice", "c1")
    assert rebuilt.bytes == summed(rebuilt) == 45
