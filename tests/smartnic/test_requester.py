"""The requester's index: blocks by content, contexts by (user, context id), leases, rebuild (pure)."""
from smartnic.requester import Requester, StoredBlock


def block(h: bytes, index: int, parent: bytes = b"", user: str = "alice", generation: int = 1, key: bytes = b"") -> StoredBlock:
    return StoredBlock(h, parent, "acme", user, False, index, 32, "s0", key or h, 1000, 0, generation)


def test_a_block_is_found_by_content_and_listed_in_its_context():
    r = Requester()
    r.publish(block(b"a", 0), "c1", "alice", now=1.0)
    r.publish(block(b"b", 1, b"a"), "c1", "alice", now=2.0)
    assert r.has(b"a") and r.get(b"b").parent == b"a"
    assert r.context("alice", "c1").hashes == [b"a", b"b"]
    assert r.context("bob", "c1") is None  # contexts are per user


def test_two_contexts_with_one_prefix_share_its_block():
    r = Requester()
    r.publish(block(b"a", 0), "c1", "alice", now=1.0)
    r.publish(block(b"a", 0), "c2", "alice", now=2.0)
    assert len(r) == 1 and r.get(b"a").contexts == 2
    assert r.drop_context("alice", "c1") == []  # c2 still lists it
    assert [b.hash for b in r.drop_context("alice", "c2")] == [b"a"] and not r.has(b"a")


def test_a_diverging_turn_replaces_the_rest_of_the_chain():
    r = Requester()
    for i, h in enumerate((b"a", b"b", b"c")):
        r.publish(block(h, i, b"" if not i else b"abc"[i - 1:i]), "c1", "alice", now=1.0)
    r.publish(block(b"x", 1, b"a"), "c1", "alice", now=2.0)
    assert r.context("alice", "c1").hashes == [b"a", b"x"]
    assert r.get(b"b").contexts == 0 and r.get(b"c").contexts == 0


def test_leases_and_removal():
    r = Requester()
    r.publish(block(b"a", 0), "c1", "alice", now=1.0)
    r.lease([b"a"])
    assert r.leased(b"a")
    r.release([b"a"])
    assert not r.leased(b"a") and r.remove(b"a").hash == b"a" and not r.has(b"a")


def test_rebuild_keeps_the_newest_generation():
    r = Requester()
    loaded = r.rebuild([("c1", block(b"a", 0, generation=2, key=b"k2")), ("c1", block(b"a", 0, generation=1, key=b"k1"))],
                       now=5.0)
    assert loaded == 1 and r.get(b"a").generation == 2 and r.context("alice", "c1").hashes == [b"a"]


def test_blocks_published_out_of_order_fill_their_places():
    r = Requester()
    r.publish(block(b"c", 2, b"b"), "c1", "alice", now=1.0)
    r.publish(block(b"a", 0), "c1", "alice", now=1.0)
    r.publish(block(b"b", 1, b"a"), "c1", "alice", now=1.0)
    assert r.context("alice", "c1").hashes == [b"a", b"b", b"c"]


def test_a_block_whose_delete_was_refused_is_reinstated_unless_its_name_came_back():
    r = Requester()
    r.publish(block(b"a", 0), "c1", "alice", now=1.0)
    removed = r.remove(b"a")
    assert r.reinstate(removed) and r.get(b"a") is removed
    assert r.context("alice", "c1").hashes == [b"a"]  # its context still lists it
    r.remove(b"a")
    r.publish(block(b"a", 0, generation=9), "c1", "alice", now=2.0)  # stored again meanwhile: that record stands
    assert not r.reinstate(removed) and r.get(b"a").generation == 9
