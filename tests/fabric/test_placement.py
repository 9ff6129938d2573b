from __future__ import annotations

from fabric.placement import place, rank

KEYS = [i.to_bytes(16, "little") for i in range(2000)]


def test_adding_a_node_moves_only_chunks_to_it():
    before = {k: place(k, ["s0", "s1", "s2"]) for k in KEYS}
    after = {k: place(k, ["s0", "s1", "s2", "s3"]) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "s3" for k in moved)
    assert 0.15 < len(moved) / len(KEYS) < 0.35  # about a quarter


def test_spread_and_fallback_to_the_next_ranked_available_node():
    homes = [place(k, ["s0", "s1"]) for k in KEYS]
    assert 0.4 < homes.count("s0") / len(KEYS) < 0.6
    k = KEYS[0]
    order = rank(k, ["s0", "s1", "s2"])
    assert place(k, ["s0", "s1", "s2"], available={order[1], order[2]}) == order[1]
    assert place(k, ["s0"], available=set()) is None
