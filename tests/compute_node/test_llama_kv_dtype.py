"""The paged forward over a pool of bf16 or fp8 e4m3 KV: what is stored, what attention reads, and how far
the logits move from fp32's, on tiny random Llamas (tests/compute_node/test_llama.py's)."""
from __future__ import annotations

import pytest
import torch

from compute_node import paged_attention
from compute_node.llama import pool_shape
from compute_node.model_runner import ModelRunner, SeqRun
from tests.compute_node.test_llama import BLOCK_TOKENS, NUM_BLOCKS, model, prompt, tables  # noqa: F401

DTYPES = [torch.bfloat16, torch.float8_e4m3fn]
# how far a dtype's logits may lie from fp32's on these O(1)-logit models: bf16 keeps 8 bits of mantissa,
# fp8 e4m3 3 (measured: at most 0.0012 and 0.014); a pool read as the wrong type is far off
LOOSE = {torch.bfloat16: 0.01, torch.float8_e4m3fn: 0.1}


def runner_of(model, dtype, kernel: bool = False) -> ModelRunner:  # noqa: F811
    generator = torch.Generator().manual_seed(1)
    pool = (torch.randn(pool_shape(model.config, NUM_BLOCKS, BLOCK_TOKENS), generator=generator) * 50).to(dtype)
    return ModelRunner(model, pool, attention_kernel=kernel)


def run(runner: ModelRunner, ids: list[int], table: list[int], chunks: list[int]) -> list[torch.Tensor]:
    """Prefill ids[:chunks[-1]] in the given chunk ends, then decode the rest; each step's logits."""
    out, start = [], 0
    for end in chunks:
        out.append(runner.step([SeqRun(ids[start:end], start, table)])[0])
        start = end
    for p in range(start, len(ids)):
        out.append(runner.step([SeqRun([ids[p]], p, table)])[0])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_pool_of_another_dtype_never_uses_the_fp32_kernel(model, dtype):  # noqa: F811
    runner = runner_of(model, dtype, kernel=paged_attention.kernel_built())
    assert runner.llama.kernel is False and runner.pool.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_pool_holds_the_fp32_kv_rounded_to_its_dtype(model, dtype):  # noqa: F811
    ids, table = prompt(30, 3), tables(1)[0]
    wide, narrow = runner_of(model, torch.float32), runner_of(model, dtype)
    run(wide, ids, table, [13, 27])
    run(narrow, ids, table, [13, 27])
    blocks = torch.tensor([table[p // BLOCK_TOKENS] for p in range(len(ids))])
    offsets = torch.arange(len(ids)) % BLOCK_TOKENS
    ours = narrow.pool[blocks, 0, :, :, offsets].float()  # layer 0: its K/V do not depend on the attention
    rounded = paged_attention.to_pool(wide.pool[blocks, 0, :, :, offsets], dtype).float()
    # equal but where fp32 summation order put a value on the other side of a rounding boundary
    assert (ours == rounded).float().mean() > 0.99
    assert torch.isfinite(narrow.pool[blocks, :, :, :, offsets].float()).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_and_whole_prefills_read_the_same_rounded_kv(model, dtype):  # noqa: F811
    """A chunk attends over its own new K/V as the pool will hold them, so where the chunks end does not
    change what later tokens see (the resident and the restored paths chunk a context differently)."""
    ids, table = prompt(40, 4), tables(1)[0]
    whole = run(runner_of(model, dtype), ids, table, [24])
    chunked = run(runner_of(model, dtype), ids, table, [5, 13, 24])
    for a, b in zip(whole[1:], chunked[3:]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_stay_near_fp32s_and_move_at_all(model, dtype):  # noqa: F811
    ids, table = prompt(40, 5), tables(1)[0]
    wide = torch.stack(run(runner_of(model, torch.float32), ids, table, [24]))
    narrow = torch.stack(run(runner_of(model, dtype), ids, table, [24]))
    diff = float((wide - narrow).abs().max())
    assert 0 < diff <= LOOSE[dtype], f"{dtype}: logits differ from fp32's by {diff:.3g}"


def test_fp8_clamps_past_its_range():
    x = torch.tensor([1000.0, -1000.0, 1.0, 0.0])
    got = paged_attention.to_pool(x, torch.float8_e4m3fn).float()
    assert got.tolist() == [448.0, -448.0, 1.0, 0.0]
    assert torch.isfinite(paged_attention.to_pool(torch.tensor([float("inf")]), torch.float8_e4m3fn).float()).all()
