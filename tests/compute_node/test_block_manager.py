"""The block manager: ref counts, the salted prefix cache, LRU of cached free blocks, I/O pins (pure)."""
from __future__ import annotations

import hashlib
import struct

import pytest

from compute_node.block_manager import BlockManager, NoFreeBlock
from compute_node.sequence import Sequence
from hostmem.block_hash import Salts, block_hash, hash_chain

BT = 4


def seq(tokens, salt=b"tenant-a", max_new=4):
    return Sequence(list(tokens), max_new_tokens=max_new, block_tokens=BT, salt=salt)


def computed(bm, tokens, salt=b"tenant-a"):
    """A sequence allocated and prefilled (all but its last token, as after a real prefill step)."""
    s = seq(tokens, salt)
    bm.allocate(s)
    bm.mark_computed(s, len(s) - 1 - s.num_computed_tokens)
    return s


def free_sets(bm):
    return set(bm._plain), set(bm._cached), set(bm._pinned_free)


# -- the hash chain
def test_hash_chain_equals_a_recomputation_from_its_definition():
    tokens, salt = list(range(100, 111)), b"salt"
    parent, expected = b"", []
    for i in range(len(tokens) // BT):  # the partial block (2 tokens) has no hash
        h = hashlib.blake2b(digest_size=16)
        h.update(struct.pack("<II", len(parent), len(salt)) + parent + salt)
        h.update(b"".join(t.to_bytes(4, "little") for t in tokens[i * BT:(i + 1) * BT]))
        parent = h.digest()
        expected.append(parent)
    assert hash_chain(tokens, salt, BT) == expected and len(expected) == 2
    assert block_hash(expected[0], tokens[BT:2 * BT], salt) == expected[1]
    assert hash_chain(tokens, salt, BT, parent=expected[0], start_block=1) == expected[1:]


def test_a_block_hash_depends_on_everything_before_it_and_on_the_salt():
    a = hash_chain([1, 2, 3, 4, 5, 6, 7, 8], b"s", BT)
    b = hash_chain([9, 2, 3, 4, 5, 6, 7, 8], b"s", BT)  # only block 0 differs
    assert a[0] != b[0] and a[1] != b[1]
    assert hash_chain([1, 2, 3, 4], b"t", BT)[0] != a[0]
    assert hash_chain([1, 2, 3, 4], b"", BT)[0] != a[0]


# -- allocation and ref counts
def test_allocation_gives_one_block_per_block_of_tokens_and_deallocation_frees_them():
    bm = BlockManager(8, BT)
    a, b = seq(range(10)), seq(range(50, 53))
    bm.allocate(a)
    bm.allocate(b)
    assert len(a.block_table) == 3 and len(b.block_table) == 1
    assert len(set(a.block_table + b.block_table)) == 4
    assert all(bm.blocks[i].ref_count == 1 for i in a.block_table + b.block_table)
    assert bm.num_free_blocks == 4 and bm.usage == pytest.approx(0.5)
    bm.deallocate(a)
    assert a.block_table == [] and bm.num_free_blocks == 7 and bm.usage == pytest.approx(1 / 8)
    assert not bm.can_allocate(seq(range(40)))  # 10 blocks
    with pytest.raises(NoFreeBlock):
        bm.allocate(seq(range(40)))


def test_a_decode_crossing_a_block_boundary_gets_a_new_block_and_full_blocks_get_their_hash():
    bm = BlockManager(3, BT)
    s = seq(range(4))
    bm.allocate(s)
    assert bm.mark_computed(s, 3) == [] and bm.blocks[s.block_table[0]].hash is None
    s.append_token(7)  # the sampled token: 5 tokens, the 5th starts block 1
    assert bm.can_append(s) and len(s.block_table) == 1
    bm.may_append(s)
    assert len(s.block_table) == 2
    assert bm.mark_computed(s, 1) == [0]  # block 0's last token is computed now
    assert bm.blocks[s.block_table[0]].hash == hash_chain(s.token_ids, s.salt, BT)[0]
    s.append_token(8)
    bm.may_append(s)  # 6 tokens: still 2 blocks
    assert len(s.block_table) == 2
    other = seq(range(20, 24))
    bm.allocate(other)
    assert bm.num_allocatable_blocks == 0
    s.token_ids += [9, 10, 11]  # 9 tokens: a third block is needed and none is free
    assert not bm.can_append(s)


# -- the prefix cache
def test_identical_prefixes_with_the_same_salt_share_blocks_and_count_as_hits():
    bm = BlockManager(16, BT)
    a = computed(bm, range(11))  # blocks 0, 1 full; 2 partial
    b = seq(list(range(8)) + [77, 78, 79])
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert (b.num_cached_tokens, b.num_computed_tokens) == (8, 8)
    assert [bm.blocks[i].ref_count for i in b.block_table] == [2, 2, 1]
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (11 + 11, 8)


def test_the_same_tokens_under_another_salt_never_hit():
    bm = BlockManager(16, BT)
    a = computed(bm, range(11), salt=b"tenant-a")
    b = seq(range(11), salt=b"tenant-b")
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)
    assert bm.prefix_cache_hits == 0


def test_a_tenants_shared_prefix_serves_its_other_users_but_their_own_blocks_stay_apart():
    bm = BlockManager(32, BT)
    tokens = list(range(13))  # blocks 0, 1 lie inside the 9-token shared prefix; 2 does not
    a = computed(bm, tokens, salt=Salts.of("acme", "alice", 9, BT))
    b = seq(tokens, salt=Salts.of("acme", "bob", 9, BT))
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8 and b.block_hashes[:2] == a.block_hashes[:2]
    assert b.block_hashes[2] != a.block_hashes[2]  # same tokens, another user: a private block of its own
    c = seq(tokens, salt=Salts.of("acme", "bob", 0, BT))  # bob without the shared prefix marked: nothing
    d = seq(tokens, salt=Salts.of("other", "carol", 9, BT))  # another tenant's shared prefix: nothing
    for s in (c, d):
        bm.allocate(s)
        assert s.num_cached_tokens == 0 and not set(s.block_table) & set(a.block_table)


def test_a_fully_cached_prompt_still_computes_its_last_block():
    bm = BlockManager(16, BT)
    a = computed(bm, range(8))
    a.append_token(5)
    bm.may_append(a)
    bm.mark_computed(a, 1)  # both blocks of the first 8 tokens are full and hashed
    b = seq(range(8))
    bm.allocate(b)
    # Block 1 is cached too, but taking it would leave no token to compute (no logits).
    assert b.num_cached_tokens == 4 and b.num_tokens_to_compute == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_freed_full_blocks_stay_findable_and_a_later_sequence_revives_them():
    bm = BlockManager(8, BT)
    a = computed(bm, range(9))
    old = list(a.block_table)
    bm.deallocate(a)
    assert bm.num_cached_free_blocks == 2 and bm.num_free_blocks == 8
    b = seq(range(9))
    bm.allocate(b)
    assert b.block_table[:2] == old[:2] and b.num_cached_tokens == 8
    assert bm.num_cached_free_blocks == 0 and [bm.blocks[i].ref_count for i in b.block_table] == [1, 1, 1]


def cached(bm, tokens, salt=b"tenant-a"):
    """Whether the first block of tokens is findable in the prefix cache."""
    return hash_chain(list(tokens), salt, BT)[0] in bm.hash_to_block


def test_fresh_blocks_first_then_cached_ones_least_recently_freed_first():
    bm = BlockManager(6, BT)
    a, b, c = (computed(bm, range(k, k + 5)) for k in (0, 100, 200))  # 2 blocks each, block 0 hashed
    for s in (a, b, c):
        bm.deallocate(s)
    assert bm.num_cached_free_blocks == 3 and len(bm._plain) == 3  # hashless tails are plain
    d = seq(range(300, 311))  # 3 blocks: the three plain ones, no cached block is touched
    bm.allocate(d)
    assert bm.num_cached_free_blocks == 3 and all(cached(bm, s.token_ids) for s in (a, b, c))
    bm.allocate(seq(range(400, 403)))  # 1 block: the least recently freed cached one (a's head)
    assert not cached(bm, a.token_ids) and cached(bm, b.token_ids) and cached(bm, c.token_ids)
    bm.allocate(seq(range(500, 503)))
    assert not cached(bm, b.token_ids) and cached(bm, c.token_ids)


def test_a_revived_and_freed_again_block_becomes_the_most_recently_freed():
    bm = BlockManager(4, BT)
    a, b = computed(bm, range(5)), computed(bm, range(100, 105))
    bm.deallocate(a)
    bm.deallocate(b)
    again = seq(range(5))  # revives a's head (and takes a plain block)
    bm.allocate(again)
    bm.deallocate(again)  # a's head is now freed after b's
    bm.allocate(seq(range(300, 311)))  # 3 blocks: 2 plain, then the least recently freed cached (b's)
    assert cached(bm, a.token_ids) and not cached(bm, b.token_ids)


def test_the_prefix_outlives_the_tail_when_blocks_are_reused():
    bm = BlockManager(4, BT)
    a = computed(bm, range(9))  # blocks 0, 1 hashed, block 2 partial
    a.token_ids += [1, 2, 3]
    bm.mark_computed(a, 4)  # 12 tokens, all 3 blocks full and hashed
    chain = hash_chain(a.token_ids, a.salt, BT)
    bm.deallocate(a)
    assert bm.num_cached_free_blocks == 3
    bm.allocate(seq(range(500, 508)))  # 2 blocks: the fresh one, then the least recently freed: a's last
    assert [h in bm.hash_to_block for h in chain] == [True, True, False]


# -- pins
def test_a_pinned_free_block_is_never_allocated_until_unpinned():
    bm = BlockManager(4, BT)
    a = computed(bm, range(5))  # 4 tokens computed: block 0 holds KV, block 1 none
    table = list(a.block_table)
    blocks = bm.deallocate(a, pin=True)  # a swap-out: the blocks holding KV, pinned
    assert blocks == a.pinned_blocks == table[:1]
    assert bm.num_pinned_free_blocks == 1 and bm.num_allocatable_blocks == 3
    assert bm.usage == pytest.approx(0.25)  # a block held by I/O is in use
    taken = seq(range(600, 612))  # 3 blocks: every allocatable one
    bm.allocate(taken)
    assert blocks[0] not in taken.block_table
    assert not bm.can_allocate(seq(range(700, 703)))
    bm.pin(blocks[0])
    bm.unpin(blocks[0])  # pins are counted: one I/O still in flight
    assert bm.num_allocatable_blocks == 0
    bm.unpin(blocks[0])
    assert bm.num_allocatable_blocks == 1 and bm.num_pinned_blocks == 0
    with pytest.raises(RuntimeError, match="is not pinned"):
        bm.unpin(blocks[0])


def test_a_pinned_cached_block_is_still_found_by_its_prefix():
    bm = BlockManager(4, BT)
    a = computed(bm, range(5))
    head = a.block_table[0]
    bm.deallocate(a, pin=True)
    b = seq(range(5))
    bm.allocate(b)
    assert b.block_table[0] == head and b.num_cached_tokens == 4
    assert bm.blocks[head].ref_count == 1 and bm.blocks[head].pins == 1
    bm.unpin(head)
    bm.deallocate(b)
    assert head in bm._cached


def test_pinning_only_the_blocks_holding_kv():
    bm = BlockManager(4, BT)
    s = seq(range(8))
    bm.allocate(s)
    bm.mark_computed(s, 5)  # 5 tokens computed: blocks 0 and 1 hold KV
    s.append_token(1)
    bm.may_append(s)
    table = list(s.block_table)
    assert len(table) == 3
    assert bm.deallocate(s, pin=True) == table[:2]
    assert free_sets(bm)[2] == set(table[:2]) and table[2] in bm._plain


# -- restores
def test_a_restore_fills_only_the_blocks_not_found_in_the_prefix_cache():
    bm = BlockManager(8, BT)
    computed(bm, range(5))  # block 0 of range(...) is cached
    s = seq(list(range(10)))
    assert bm.allocate_for_restore(s, 10) == [1, 2]  # target 9 tokens (one left to compute): blocks 1, 2
    assert s.num_computed_tokens == 4 and all(bm.blocks[s.block_table[i]].pins == 1 for i in (1, 2))
    bm.restore_done(s, 10)
    assert s.num_computed_tokens == 9 and s.num_tokens_to_compute == 1
    assert bm.num_pinned_blocks == 0
    assert bm.blocks[s.block_table[1]].hash == hash_chain(s.token_ids, s.salt, BT)[1]
    assert bm.blocks[s.block_table[2]].hash is None  # partial


def test_a_partial_restore_keeps_what_landed_and_leaves_the_rest_to_prefill():
    bm = BlockManager(8, BT)
    s = seq(range(14))
    assert bm.allocate_for_restore(s, 12) == [0, 1, 2]
    bm.restore_done(s, 6)  # block 1 failed half way
    assert s.num_computed_tokens == 6 and s.num_tokens_to_compute == 8
    assert bm.blocks[s.block_table[0]].hash is not None and bm.blocks[s.block_table[1]].hash is None


def test_a_restore_never_covers_more_than_it_was_asked_for():
    bm = BlockManager(8, BT)
    s = seq(range(14))
    assert bm.allocate_for_restore(s, 10) == [0, 1, 2]
    bm.restore_done(s, 12)  # block 2 holds 2 restored tokens; the rest of it is not KV of s
    assert s.num_computed_tokens == 10 and bm.num_pinned_blocks == 0


def test_an_abandoned_restore_keeps_its_pins_until_the_io_ends():
    bm = BlockManager(3, BT)
    s = seq(range(9))
    bm.allocate_for_restore(s, 8)
    filling = [s.block_table[i] for i in s.restore_blocks]
    bm.deallocate(s)  # the request went away while the GET is in flight
    assert s.pinned_blocks == filling and bm.num_allocatable_blocks == 3 - len(filling)
    for b in filling:
        bm.unpin(b)
    assert bm.num_allocatable_blocks == 3
