"""The routing policies: round robin, least loaded, kv_aware (prefix index, owner-scoped, balance)."""
import pytest

from chat_frontend.routing import Load, PrefixIndex, Router, block_hashes

NAMES = ["replica-0", "replica-1", "replica-2"]
BLOCK_TOKENS = 32  # a compute node's pool, as its Info tells the frontend


def loads(*sequences: int) -> list[Load]:
    return [Load(name, running=n) for name, n in zip(NAMES, sequences)]


def prompt(seed: int, blocks: int) -> list[int]:
    return [seed * 100_000 + i for i in range(blocks * BLOCK_TOKENS)]


def test_block_hashes_chain_full_blocks_and_are_owner_scoped():
    ids = prompt(1, 3) + [7] * (BLOCK_TOKENS - 1)  # a partial block is not hashed
    hashes = block_hashes("t\0alice", ids, BLOCK_TOKENS)
    assert len(hashes) == 3 and len(set(hashes)) == 3
    assert block_hashes("t\0alice", ids[:2 * BLOCK_TOKENS], BLOCK_TOKENS) == hashes[:2]  # a prefix's chain is a prefix
    assert not set(block_hashes("t\0bob", ids, BLOCK_TOKENS)) & set(hashes)  # another user: nothing in common
    other = list(ids)
    other[0] += 1
    assert not set(block_hashes("t\0alice", other, BLOCK_TOKENS)) & set(hashes)  # chained: block 0 changes them all


def test_round_robin_goes_in_turn_over_the_healthy_ones():
    router = Router(NAMES, "round_robin")
    picks = [router.pick("o", [], loads(0, 0, 0)).replica for _ in range(4)]
    assert picks == ["replica-0", "replica-1", "replica-2", "replica-0"]
    up = [Load("replica-0"), Load("replica-2")]  # replica-1 is down
    assert [router.pick("o", [], up).replica for _ in range(3)] == ["replica-2", "replica-0", "replica-2"]
    assert router.pick("o", [], []) is None


def test_least_loaded_counts_running_waiting_and_sent_since_the_figures():
    router = Router(NAMES, "least_loaded")
    assert router.pick("o", [], loads(3, 1, 2)).replica == "replica-1"
    figures = [Load("replica-0", running=1, waiting=0, sent=0), Load("replica-1", running=0, waiting=1, sent=1),
               Load("replica-2", running=0, waiting=0, sent=2)]
    assert router.pick("o", [], figures).replica == "replica-0"
    # ties go in turn
    assert [router.pick("o", [], loads(0, 0, 0)).replica for _ in range(3)] == ["replica-1", "replica-2",
                                                                                 "replica-0"]


def test_kv_aware_follows_the_prefix_and_balances_past_the_threshold():
    router = Router(NAMES, "kv_aware", balance_abs_threshold=2, block_tokens=BLOCK_TOKENS)
    first = prompt(1, 4)
    chosen = router.pick("t\0alice", first, loads(5, 0, 1))
    assert chosen.replica == "replica-1" and chosen.reason == "least loaded"  # nothing held anywhere
    router.routed("t\0alice", first, chosen.replica)
    follow_up = first + prompt(2, 2)  # the next turn: the conversation so far, then more
    decision = router.pick("t\0alice", follow_up, loads(0, 2, 0))
    assert (decision.replica, decision.matched_blocks, decision.reason) == ("replica-1", 4, "prefix")
    # its load exceeds the least loaded's by more than the threshold: the least loaded
    decision = router.pick("t\0alice", follow_up, loads(0, 3, 1))
    assert (decision.replica, decision.reason) == ("replica-0", "balance")
    # another user with the same tokens does not match alice's prefix
    assert router.pick("t\0bob", follow_up, loads(1, 0, 1)).reason == "least loaded"


def test_kv_aware_prefers_the_longest_prefix_and_forgets_a_replica_that_went_down():
    router = Router(NAMES, "kv_aware", balance_abs_threshold=4, block_tokens=BLOCK_TOKENS)
    short, long = prompt(1, 2), prompt(1, 5)
    router.routed("o", short, "replica-0")
    router.routed("o", long, "replica-2")
    assert router.pick("o", long + [1], loads(0, 0, 0)).replica == "replica-2"
    router.forget("replica-2")
    decision = router.pick("o", long, loads(0, 0, 0))
    assert (decision.replica, decision.matched_blocks) == ("replica-0", 2)
    # the holder is down (not among the healthy): the least loaded of the others
    router.routed("o", long, "replica-2")
    decision = router.pick("o", long, [Load("replica-0", running=3), Load("replica-1", running=1)])
    assert (decision.replica, decision.matched_blocks) == ("replica-0", 2)
    decision = router.pick("o", long, [Load("replica-0", running=9), Load("replica-1", running=1)])
    assert (decision.replica, decision.reason) == ("replica-1", "balance")


def test_prefix_index_is_bounded_least_recently_used_out():
    index = PrefixIndex(capacity=4)
    a, b = block_hashes("o", prompt(1, 3), BLOCK_TOKENS), block_hashes("o", prompt(2, 3), BLOCK_TOKENS)
    index.insert(a, "replica-0")
    index.insert(b, "replica-1")
    assert len(index) == 4
    assert index.match(a) == {}  # a's first two blocks went out first: nothing matches from its start
    assert index.match(b) == {"replica-1": 3}
    index.insert(b[:1], "replica-0")
    assert index.match(b) == {"replica-1": 3, "replica-0": 1}


def test_a_bad_policy_or_no_replica_is_refused():
    with pytest.raises(ValueError, match="round_robin, least_loaded, kv_aware"):
        Router(NAMES, "random")
    with pytest.raises(ValueError):
        Router([], "kv_aware")


def test_kv_aware_routes_by_load_until_a_compute_node_told_its_block_size():
    router = Router(NAMES, "kv_aware")   # no Info yet: no block size to hash prompts by
    router.routed("o", prompt(1, 3), "replica-2")
    decision = router.pick("o", prompt(1, 3), loads(0, 1, 0))
    assert decision.reason == "least loaded" and decision.matched_blocks == 0 and len(router.index) == 0
    router.block_tokens = BLOCK_TOKENS
    router.routed("o", prompt(1, 3), "replica-2")
    assert router.pick("o", prompt(1, 3), loads(0, 1, 0)).replica == "replica-2"
