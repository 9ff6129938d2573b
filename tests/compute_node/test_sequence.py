"""A sequence's token and block arithmetic (pure)."""
from __future__ import annotations

import pytest

from compute_node.sequence import Sequence, SequenceStatus


def test_blocks_cover_every_token_and_the_last_block_may_be_partial():
    seq = Sequence(list(range(10)), max_new_tokens=3, block_tokens=4)
    assert (len(seq), seq.num_blocks, seq.num_full_blocks) == (10, 3, 2)
    assert seq.block_token_ids(1) == [4, 5, 6, 7] and seq.block_token_ids(2) == [8, 9]
    with pytest.raises(IndexError, match="out of range"):
        seq.block_token_ids(3)
    seq.append_token(10)
    seq.append_token(11)
    assert (seq.num_blocks, seq.num_full_blocks, seq.completion_token_ids) == (3, 3, [10, 11])
    seq.append_token(12)
    assert seq.num_blocks == 4 and seq.num_prompt_tokens == 10 and seq.num_completion_tokens == 3


def test_max_blocks_leaves_out_the_last_token_it_may_generate():
    # 10 prompt + 3 new: the KV never holds the 13th token, so 12 tokens, 3 blocks of 4.
    assert Sequence(list(range(10)), max_new_tokens=3, block_tokens=4).max_blocks == 3
    assert Sequence(list(range(10)), max_new_tokens=4, block_tokens=4).max_blocks == 4
    assert Sequence([1], max_new_tokens=1, block_tokens=4).max_blocks == 1


def test_tokens_to_compute_prefill_then_decode():
    seq = Sequence(list(range(6)), max_new_tokens=5, block_tokens=4)
    assert seq.num_tokens_to_compute == 6 and not seq.is_decode and not seq.prefill_done
    seq.num_computed_tokens = 6
    assert seq.prefill_done and seq.num_tokens_to_compute == 0
    seq.append_token(99)
    assert seq.is_decode and seq.last_token == 99


def test_identity_equality_ids_and_opaque_payload():
    a = Sequence([1, 2], 1, 4, payload={"temperature": 0.0})
    b = Sequence([1, 2], 1, 4, payload={"temperature": 0.0})
    assert a != b and len({a, b}) == 2 and a.seq_id != b.seq_id
    assert a.status is SequenceStatus.WAITING and a.payload == {"temperature": 0.0}


@pytest.mark.parametrize("kwargs", [
    {"token_ids": [], "max_new_tokens": 1, "block_tokens": 4}, {"token_ids": [1], "max_new_tokens": 0, "block_tokens": 4},
    {"token_ids": [1], "max_new_tokens": 1, "block_tokens": 4, "salt": "text"}])
def test_bad_sequences_are_refused(kwargs):
    with pytest.raises((ValueError, TypeError)):
        Sequence(**kwargs)
