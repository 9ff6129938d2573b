"""The compiled attention kernel against torch's attention over the same gathered keys, and its checks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compute_node import paged_attention
from compute_node.paged_attention import KernelTokens

pytestmark = pytest.mark.skipif(not paged_attention.kernel_built(), reason="the attention kernel was not built")

NUM_BLOCKS, LAYERS, KV_HEADS, BLOCK_TOKENS, HEAD_DIM, HEADS = 20, 3, 2, 8, 16, 6


def pool() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(NUM_BLOCKS, LAYERS, 2, KV_HEADS, BLOCK_TOKENS, HEAD_DIM, generator=generator) * 3


def reference(pool: torch.Tensor, layer: int, q: torch.Tensor, table: list[int], length: int) -> torch.Tensor:
    """One query token [HEADS, D] over the first `length` keys of its blocks, by torch: [HEADS, D]."""
    blocks = pool[table, layer]                                   # [blocks, 2, Hkv, T, D]
    kv = blocks.permute(1, 2, 0, 3, 4).reshape(2, KV_HEADS, -1, HEAD_DIM)[:, :, :length]
    return F.scaled_dot_product_attention(q[:, None], kv[0], kv[1], enable_gqa=True)[:, 0]


def test_each_token_attends_its_own_blocks_up_to_its_own_length():
    kv = pool()
    tables = [[3, 17, 5, 0], [9, 2, -1, -1], [11, -1, -1, -1], [3, 17, 5, 0]]
    lens = [29, 16, 1, 8]  # across blocks; a full block's end; a single key; a block boundary
    q = torch.randn(4, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    tokens = KernelTokens(None, torch.tensor(tables, dtype=torch.int32), torch.tensor(lens))
    for layer in range(LAYERS):
        out = tokens.attend(kv, layer, q)
        for i, (table, length) in enumerate(zip(tables, lens)):
            used = table[:-(-length // BLOCK_TOKENS)]
            torch.testing.assert_close(out[i], reference(kv, layer, q[i], used, length), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("table, length, message", [
    ([3, NUM_BLOCKS], 9, f"reads block {NUM_BLOCKS} of a pool of {NUM_BLOCKS}"),
    ([3, -1], 9, "reads block -1"),
    ([3, 4], 17, "has 17 keys, its table holds 1 to 16"),
    ([3, 4], 0, "has 0 keys"),
])
def test_a_length_or_block_outside_the_table_or_pool_is_refused(table, length, message):
    """Checked in C before anything is read."""
    tokens = KernelTokens(None, torch.tensor([table], dtype=torch.int32), torch.tensor([length]))
    with pytest.raises(ValueError, match=message):
        tokens.attend(pool(), 0, torch.zeros(1, HEADS, HEAD_DIM))


def test_tables_or_lengths_of_another_type_are_refused_before_the_kernel_reads_them():
    with pytest.raises(TypeError, match="int32"):  # int64 ids would be read as pairs of int32 ones
        KernelTokens(None, torch.tensor([[3, 4]], dtype=torch.int64), torch.tensor([9]))
    with pytest.raises(TypeError, match="lens int64"):
        KernelTokens(None, torch.tensor([[3, 4]], dtype=torch.int32), torch.tensor([9], dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):  # a view's pointer does not start its rows
        KernelTokens(None, torch.tensor([[3, 4], [5, 6]], dtype=torch.int32).t(), torch.tensor([9, 9]))
    with pytest.raises(ValueError, match=r"lens \[N\]"):
        KernelTokens(None, torch.tensor([[3, 4]], dtype=torch.int32), torch.tensor([9, 9]))


def test_a_pool_or_query_of_another_type_or_shape_is_refused_before_the_kernel_reads_them():
    tokens = KernelTokens(None, torch.tensor([[3, 4]], dtype=torch.int32), torch.tensor([9]))
    q = torch.zeros(1, HEADS, HEAD_DIM)
    with pytest.raises(TypeError, match="pool must be float32"):
        tokens.attend(pool().double(), 0, q)
    with pytest.raises(ValueError, match="contiguous"):
        tokens.attend(pool().transpose(4, 5), 0, q)
    with pytest.raises(TypeError, match="q must be float32"):
        tokens.attend(pool(), 0, q.half())
    with pytest.raises(ValueError, match="q must be"):
        tokens.attend(pool(), 0, torch.zeros(1, HEADS, HEAD_DIM * 2))
    with pytest.raises(ValueError, match="layer 3 out of range"):
        tokens.attend(pool(), LAYERS, q)


def test_a_prefill_chunk_sees_every_cached_key_and_its_own_up_to_itself():
    mask = paged_attention.prefill_mask(cached=5, ctx=8, device="cpu")  # a chunk of 3 after 5 cached tokens
    assert mask.dtype == torch.float32 and mask.shape == (3, 8)
    visible = mask == 0
    assert visible.tolist() == [[True] * 6 + [False] * 2, [True] * 7 + [False], [True] * 8]
    assert torch.isneginf(mask[~visible]).all()
