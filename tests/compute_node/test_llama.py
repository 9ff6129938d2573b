"""Our paged Llama forward against transformers' on tiny random Llamas (GQA, tied and untied, rope scaling)."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from compute_node import paged_attention
from compute_node.llama import pool_shape
from compute_node.model_runner import ModelRunner, SeqRun

# Logits of these models are O(1); ours and transformers' differ by ~4e-7 (float summation order).
ATOL = 1e-5
BLOCK_TOKENS = 8
NUM_BLOCKS = 48
VOCAB = 512

CONFIGS = {
    # SmolLM2's shape in small: 3 query heads per KV head, tied embeddings, default rope
    "tied-gqa3": {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 3, "num_attention_heads": 6,
                  "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 50000.0, "rms_norm_eps": 1e-5,
                  "tie_word_embeddings": True},
    # untied head, biases on the projections, llama3 rope scaling, 4 query heads per KV head
    "untied-bias-llama3": {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "rms_norm_eps": 1e-6,
                           "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True,
                           "rope_parameters": {"rope_type": "llama3", "rope_theta": 20000.0, "factor": 4.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 16}},
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=256, **CONFIGS[request.param])
    return LlamaForCausalLM(config).eval()


needs_kernel = pytest.mark.skipif(not paged_attention.kernel_built(), reason="the attention kernel was not built")


@pytest.fixture(params=["torch", pytest.param("kernel", marks=needs_kernel),
                        pytest.param("kernel+torch", marks=needs_kernel)])
def attention(request, monkeypatch) -> bool:
    """Whether the compiled kernel attends; kernel+torch: only chunks of up to 8 new tokens, longer ones go
    to torch in the same step."""
    if request.param == "kernel+torch":
        monkeypatch.setattr(paged_attention, "KERNEL_MAX_CHUNK", 8)
    return request.param != "torch"


def new_runner(model, kernel: bool) -> ModelRunner:
    """A runner over a pool full of large finite garbage: whatever a mask or a length fails to hide shows up."""
    generator = torch.Generator().manual_seed(1)
    pool = torch.randn(pool_shape(model.config, NUM_BLOCKS, BLOCK_TOKENS), generator=generator) * 50
    runner = ModelRunner(model, pool, attention_kernel=kernel)
    assert runner.llama.kernel == kernel
    return runner


def tables(count: int, blocks: int = 8, seed: int = 2) -> list[list[int]]:
    """`count` disjoint block tables of shuffled block ids."""
    order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i * blocks:(i + 1) * blocks] for i in range(count)]


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.inference_mode()
def reference(model, ids: list[int]) -> torch.Tensor:
    """transformers' logits at every position of ids: [len, vocab]."""
    return model(input_ids=torch.tensor([ids])).logits[0]


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = float((a - b).abs().max())
    assert diff <= ATOL, f"logits differ by {diff:.3g} > {ATOL}"
    return diff


def test_prefill_matches_transformers(model, attention):
    runner, ids, table = new_runner(model, attention), prompt(45, 0), tables(1)[0]
    logits = runner.step([SeqRun(ids, 0, table)])
    assert logits.shape == (1, VOCAB)
    close(logits[0], reference(model, ids)[-1])


def test_prefill_in_two_chunks_matches_transformers(model, attention):
    runner, ids, table = new_runner(model, attention), prompt(45, 1), tables(1)[0]
    ref = reference(model, ids)
    close(runner.step([SeqRun(ids[:21], 0, table)])[0], ref[20])  # the chunk ends inside a block
    close(runner.step([SeqRun(ids[21:], 21, table)])[0], ref[44])


def test_decode_steps_after_a_prefill_match_transformers(model, attention):
    runner, ids, table = new_runner(model, attention), prompt(40, 2), tables(1)[0]
    ref = reference(model, ids)
    runner.step([SeqRun(ids[:24], 0, table)])
    for p in range(24, 40):  # crosses two block boundaries
        close(runner.step([SeqRun([ids[p]], p, table)])[0], ref[p])


@torch.inference_mode()
def test_kv_in_the_pool_equals_transformers_cache(model, attention):
    runner, ids, table = new_runner(model, attention), prompt(30, 3), tables(1)[0]
    runner.step([SeqRun(ids[:13], 0, table)])
    runner.step([SeqRun(ids[13:27], 13, table)])
    for p in range(27, 30):
        runner.step([SeqRun([ids[p]], p, table)])
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    pool = runner.pool  # [block, layer, K|V, kv_head, token, head_dim]
    blocks = torch.tensor([table[p // BLOCK_TOKENS] for p in range(len(ids))])
    offsets = torch.arange(len(ids)) % BLOCK_TOKENS
    for layer, kv in enumerate(cache.layers):
        ours_k = pool[blocks, layer, 0, :, offsets]  # [token, kv_head, head_dim]
        ours_v = pool[blocks, layer, 1, :, offsets]
        torch.testing.assert_close(ours_k, kv.keys[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours_v, kv.values[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def run_alone(model, attention, script: list[list[SeqRun]]) -> list[list[torch.Tensor]]:
    """Each sequence's logits per step when it runs by itself: script[step][seq] (None: not scheduled)."""
    runner = new_runner(model, attention)
    out = []
    for step in script:
        out.append([None if r is None else runner.step([r])[0] for r in step])
    return out


def run_batched(model, attention, script: list[list[SeqRun]]) -> list[list[torch.Tensor]]:
    runner = new_runner(model, attention)
    out = []
    for step in script:
        runs = [r for r in step if r is not None]
        logits = iter(runner.step(runs))
        out.append([None if r is None else next(logits) for r in step])
    return out


def mixed_script() -> tuple[list[list[int]], list[list[SeqRun]]]:
    """Four sequences of different lengths; steps that mix decodes, fresh prefills and chunks after a prefix."""
    lengths = (40, 23, 9, 50)
    ids = [prompt(n, 10 + i) for i, n in enumerate(lengths)]
    a, b, c, d = ids
    ta, tb, tc, td = tables(4, blocks=7)
    script = [
        [SeqRun(a[:39], 0, ta), None, SeqRun(c[:8], 0, tc), SeqRun(d[:30], 0, td)],
        # decode, prefill from nothing, decode, prefill after a 30-token prefix: all in one step
        [SeqRun(a[39:40], 39, ta), SeqRun(b[:20], 0, tb), SeqRun(c[8:9], 8, tc), SeqRun(d[30:46], 30, td)],
        # decodes of four different lengths (a length mask), then one more of some
        [None, SeqRun(b[20:21], 20, tb), None, SeqRun(d[46:47], 46, td)],
        [None, SeqRun(b[21:22], 21, tb), None, SeqRun(d[47:48], 47, td)],
    ]
    extra = {0: (40, a), 2: (9, c)}
    for i, (start, seq) in extra.items():
        seq.extend(prompt(4, 20 + i))
        for k, step in enumerate(script[2:]):
            step[i] = SeqRun(seq[start + k:start + k + 1], start + k, (ta, tb, tc, td)[i])
    return ids, script


def test_a_mixed_batch_equals_each_sequence_alone_and_transformers(model, attention):
    ids, script = mixed_script()
    alone, batched = run_alone(model, attention, script), run_batched(model, attention, script)
    checked = 0
    for step, runs in enumerate(script):
        for s, r in enumerate(runs):
            if r is None:
                continue
            close(batched[step][s], alone[step][s])
            end = r.start + len(r.token_ids)
            close(batched[step][s], reference(model, ids[s][:end])[-1])
            checked += 1
    assert checked == 15


def test_decodes_of_equal_length_and_in_several_gathers(model, attention, monkeypatch):
    """Equal lengths take the unmasked path; a tiny gather budget splits the batch into runs of one."""
    seqs = [prompt(19, 30 + i) for i in range(5)]
    ts = tables(5, blocks=4)
    for budget in (paged_attention.GATHER_BYTES, 1):
        monkeypatch.setattr(paged_attention, "GATHER_BYTES", budget)
        runner = new_runner(model, attention)
        for seq, table in zip(seqs, ts):
            runner.step([SeqRun(seq[:17], 0, table)])
        for p in (17, 18):
            logits = runner.step([SeqRun([seq[p]], p, table) for seq, table in zip(seqs, ts)])
            for s, seq in enumerate(seqs):
                close(logits[s], reference(model, seq[:p + 1])[-1])


def test_the_weights_and_the_pool_are_shared_not_copied(model, attention):
    runner = new_runner(model, attention)
    llama, layer = runner.llama, model.model.layers[1]
    assert llama.layers[1].q.weight.data_ptr() == layer.self_attn.q_proj.weight.data_ptr()
    assert llama.layers[1].down.weight.data_ptr() == layer.mlp.down_proj.weight.data_ptr()
    assert llama.embed.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert llama.lm_head.data_ptr() == model.lm_head.weight.data_ptr()
    before = runner.pool.data_ptr()
    table = tables(1)[0]
    runner.step([SeqRun(prompt(12, 5), 0, table)])
    assert llama.pool.data_ptr() == before


def test_a_chunk_after_cached_tokens_converts_no_mask_per_layer(model):
    """Its additive mask is built once per step: scaled_dot_product_attention would turn a bool mask into
    one at every layer (aten::where over [chunk, context])."""
    runner, ids, table = new_runner(model, False), prompt(45, 3), tables(1)[0]
    runner.step([SeqRun(ids[:21], 0, table)])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        logits = runner.step([SeqRun(ids[21:], 21, table)])
    names = [e.key for e in prof.key_averages()]
    assert "aten::scaled_dot_product_attention" in names
    assert "aten::where" not in names
    close(logits[0], reference(model, ids)[44])
