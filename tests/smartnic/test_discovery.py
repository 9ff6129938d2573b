"""The miss path's pure parts: which blocks to ask for, grouped by node, and which answers to take."""
import pytest

from fabric import chunk_format as cf
from fabric.placement import place
from hostmem.block_hash import Salts, hash_chain
from smartnic import discovery

BT = 16
SALT = "test-salt"
IDS = list(range(100, 100 + 4 * BT + 5))  # four full blocks and 5 tokens more
SALTS = Salts.of("acme", "alice", 0, BT)
CHAIN = hash_chain(IDS, SALTS, BT)


def test_the_full_blocks_the_index_lacks_are_wanted_with_their_keys():
    got = discovery.wanted(IDS, SALTS, BT, len(IDS) - 1, SALT, lambda name: name == CHAIN[1])
    assert [(w.index, w.name, w.parent) for w in got] == [(0, CHAIN[0], b""), (2, CHAIN[2], CHAIN[1]),
                                                          (3, CHAIN[3], CHAIN[2])]
    assert [w.key for w in got] == [cf.block_key(SALT, CHAIN[i]) for i in (0, 2, 3)]
    assert discovery.wanted(IDS, SALTS, BT, 4 * BT - 1, SALT, lambda name: False)[-1].index == 2  # up to the limit
    assert discovery.wanted(IDS, SALTS, BT, len(IDS) - 1, SALT, lambda name: True) == []


def test_a_shared_prefix_s_blocks_are_named_under_the_tenant_s_salt():
    salts = Salts.of("acme", "alice", 2 * BT, BT)
    got = discovery.wanted(IDS, salts, BT, len(IDS) - 1, SALT, lambda name: False)
    assert [w.shared for w in got] == [True, True, False, False]
    assert [w.name for w in got] == hash_chain(IDS, salts, BT)


def test_blocks_are_grouped_by_the_node_their_key_places_on_among_those_up():
    wanted = discovery.wanted(IDS, SALTS, BT, len(IDS) - 1, SALT, lambda name: False)
    nodes = ["s0", "s1", "s2"]
    groups = discovery.by_node(wanted, nodes, {"s0", "s1", "s2"})
    assert sorted(w.index for ws in groups.values() for w in ws) == [0, 1, 2, 3]
    assert all(place(w.key, nodes) == node for node, ws in groups.items() for w in ws)
    assert "s1" not in discovery.by_node(wanted, nodes, {"s0", "s2"})
    assert discovery.by_node(wanted, nodes, set()) == {}


def head(index: int = 1, user: str = "alice", tenant: str = "acme", shared: bool = False, tokens: int = BT,
         parent: bytes | None = None, name: bytes | None = None, mac: int = cf.MAC_BYTES) -> bytes:
    h = cf.ChunkHeader(user, "ctx-9", index, index * BT, index * BT + tokens, 4096, CHAIN[index] if name is None else name,
                       7, mac, tenant, CHAIN[index - 1] if parent is None else parent, shared, 2)
    return cf.encode_header(h)


def want(index: int = 1, shared: bool = False) -> discovery.Wanted:
    return discovery.Wanted(index, CHAIN[index], CHAIN[index - 1], cf.block_key(SALT, CHAIN[index]), shared)


def length(encoded: bytes, tokens: int = BT, mac: int = cf.MAC_BYTES) -> int:
    return len(encoded) + tokens * 4 + 3 * mac + 4096


def test_a_header_naming_the_block_wanted_is_taken_as_discovered_under_its_context():
    encoded = head()
    block, context, why = discovery.found_block(encoded + b"\0" * 100, "s1", want(), BT, "acme", "alice", mac=True)
    assert why == "" and context == "ctx-9"
    assert (block.hash, block.parent, block.storage_node, block.key, block.length, block.generation,
            block.header_bytes, block.origin, block.token_count) == (
        CHAIN[1], CHAIN[0], "s1", want().key, length(encoded), 7, len(encoded), "discovered", BT)


@pytest.mark.parametrize("case, encoded, expected", [
    ("another user", head(user="bob"), "another owner"),
    ("another tenant", head(tenant="other"), "another owner"),
    ("marked shared", head(shared=True), "another owner"),
    ("another block", head(name=b"x" * 16), "another block"),
    ("another parent", head(parent=b"y" * 16), "another block"),
    ("a partial block", head(tokens=BT - 1), "tokens"),
    ("no MAC", head(mac=0), "no MAC"),
])
def test_a_header_that_does_not_name_the_block_wanted_is_not_taken(case, encoded, expected):
    block, _, why = discovery.found_block(encoded, "s1", want(), BT, "acme", "alice", mac=True)
    assert block is None and why.startswith(expected)


def test_a_shared_block_is_taken_whichever_user_of_the_tenant_stored_it_and_garbage_is_not():
    encoded = head(user="bob", shared=True)
    block, _, why = discovery.found_block(encoded, "s1", want(shared=True), BT, "acme", "alice", mac=True)
    assert why == "" and block.shared and block.user_id == "bob"
    block, _, why = discovery.found_block(b"garbage" * 40, "s1", want(), BT, "acme", "alice", mac=True)
    assert block is None and why.startswith("bad header")


def test_a_head_read_is_a_whole_header_but_never_longer_than_the_shortest_value():
    assert discovery.head_bytes("acme", None) == cf.MAX_HEADER_BYTES
    assert discovery.head_bytes("acme", 1 << 20) == cf.MAX_HEADER_BYTES
    assert discovery.head_bytes("acme", 100) == cf.MIN_HEADER_BYTES + 4 + 100
    assert discovery.head_bytes("acme", 100) <= len(cf.encode_header(cf.ChunkHeader(
        "", "", 0, 0, 25, 0, b"n" * 16, tenant="acme", mac_bytes=0))) + 100


def test_blocks_proved_bad_are_remembered_by_generation_within_a_bound():
    bad = discovery.ProvedBad(limit=2)
    bad.add(b"a", 1)
    assert (b"a", 1) in bad and (b"a", 2) not in bad
    bad.add(b"b", 1)
    bad.add(b"c", 1)
    assert (b"a", 1) not in bad and (b"c", 1) in bad
