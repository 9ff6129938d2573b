"""The model runner: its step builder, its choice helpers, and the real model against transformers."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from compute_node.llama import pool_shape
from compute_node.model_runner import ModelRunner, SeqRun, build_step

# The real model's logits reach ~30; ours equal transformers' bit for bit for a prompt run whole and
# differ by ~5e-5 when it is chunked or batched (float summation order).
REAL_ATOL = 2e-4
BLOCK_TOKENS = 32


def test_build_step_concatenates_tokens_and_pads_block_tables():
    batch = build_step([SeqRun([5, 6, 7], 0, [4, 2]), SeqRun([9], 40, [1, 3]), SeqRun([8, 8], 3, [0])], 32)
    assert batch.input_ids.tolist() == [5, 6, 7, 9, 8, 8]
    assert batch.positions.tolist() == [0, 1, 2, 40, 3, 4]
    assert batch.query_lens.tolist() == [3, 1, 2]
    assert batch.context_lens.tolist() == [3, 41, 5]
    assert batch.block_tables.dtype == torch.int32
    assert batch.block_tables.tolist() == [[4, 2], [1, 3], [0, -1]]
    assert batch.input_ids.dtype == batch.positions.dtype == torch.int64


@pytest.mark.parametrize("runs, message", [
    ([], "at least one sequence"),
    ([SeqRun([], 0, [0])], "at least one token"),
    ([SeqRun([1, 2], 31, [0])], "cannot hold 33 tokens"),
])
def test_build_step_refuses_what_cannot_run(runs, message):
    with pytest.raises(ValueError, match=message):
        build_step(runs, 32)


def test_choice_helpers_pick_per_row():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    assert ModelRunner.greedy(logits) == [1, 0]
    ties = torch.tensor([[1.0, 4.0, 4.0, 2.0], [7.0, 7.0, float("nan"), float("nan")], [2.0] * 4])
    assert ModelRunner.greedy(ties) == torch.argmax(ties, dim=-1).tolist() == [1, 2, 0]


def test_runner_refuses_a_pool_on_another_device(tiny_model):
    pool = torch.zeros(pool_shape(tiny_model.config, 4, 8))
    with pytest.raises(ValueError, match="device"):
        ModelRunner(tiny_model, pool, device="meta")


# -- the real model

@pytest.fixture(scope="module")
def real():
    """transformers' own SmolLM2 (the reference forward) and the tokenizer."""
    from compute_node.model_loader import load_model
    from compute_node.settings import ComputeSettings
    model, tokenizer = load_model(ComputeSettings().model_cache_dir, reference=True)
    return model, tokenizer


@pytest.fixture(scope="module")
def real_weights():
    """SmolLM2 as the compute node loads it (compute_node.weights: the cache's tensors alone)."""
    from compute_node import weights
    from compute_node.model_loader import load_model
    from compute_node.settings import ComputeSettings
    model, _ = load_model(ComputeSettings().model_cache_dir)
    assert isinstance(model, weights.LlamaWeights)
    return model


def chat_ids(tokenizer, text: str) -> list[int]:
    from compute_node.chat_template import ChatEncoder
    return ChatEncoder(tokenizer).encode([{"role": "user", "content": text}])


def real_runner(model, num_blocks: int = 64) -> ModelRunner:
    return ModelRunner(model, torch.zeros(pool_shape(model.config, num_blocks, BLOCK_TOKENS)))


@torch.inference_mode()
def transformers_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and the logits that chose them, batch 1 with a DynamicCache."""
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    out, seen = [], []
    for _ in range(n):
        seen.append(logits)
        out.append(int(torch.argmax(logits)))
        logits = model(input_ids=torch.tensor([[out[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    return out, seen


@pytest.mark.slow
def test_real_model_greedy_decode_equals_transformers(real, real_weights):
    """Our forward over the weights as the compute node loads them, against transformers' own model."""
    model, tokenizer = real
    ids = chat_ids(tokenizer, "Explain in a few sentences why bread dough rises.")
    n = 40
    expected, expected_logits = transformers_greedy(model, ids, n)
    runner = real_runner(real_weights)
    table = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:8].tolist()
    half = len(ids) // 2  # the prompt in two chunks
    runner.step([SeqRun(ids[:half], 0, table)])
    logits = runner.step([SeqRun(ids[half:], half, table)])[0]
    out, worst = [], 0.0
    for i in range(n):
        worst = max(worst, float((logits - expected_logits[i]).abs().max()))
        out.append(runner.greedy(logits[None])[0])
        logits = runner.step([SeqRun([out[-1]], len(ids) + i, table)])[0]
    assert out == expected, tokenizer.decode(out) + " != " + tokenizer.decode(expected)
    assert worst <= REAL_ATOL, f"logits differ by {worst:.3g}"


@pytest.mark.slow
def test_real_model_batch_equals_each_alone(real):
    """Four chat prompts of different lengths prefilled in one step, then decoded together."""
    model, tokenizer = real
    texts = ["Hi!", "What is the capital of France?", "Write a haiku about the sea, please.",
             "List three uses of a paperclip and explain each one briefly."]
    prompts = [chat_ids(tokenizer, t) for t in texts]
    tables = [list(range(8 * i, 8 * i + 8))[::-1] for i in range(4)]
    alone = []
    for ids in prompts:
        runner = real_runner(model)
        logits = [runner.step([SeqRun(ids, 0, tables[0])])[0]]
        for i in range(6):
            logits.append(runner.step([SeqRun([runner.greedy(logits[-1][None])[0]], len(ids) + i, tables[0])])[0])
        alone.append(logits)
    runner = real_runner(model)
    logits = runner.step([SeqRun(ids, 0, table) for ids, table in zip(prompts, tables)])
    for i in range(7):
        for s in range(4):
            diff = float((logits[s] - alone[s][i]).abs().max())
            assert diff <= REAL_ATOL, f"sequence {s} step {i}: logits differ by {diff:.3g}"
        if i < 6:
            picks = runner.greedy(logits)
            logits = runner.step([SeqRun([t], len(ids) + i, table) for t, ids, table in zip(picks, prompts, tables)])
