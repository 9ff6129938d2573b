"""`kvtb bench ttft`'s prefill part: prefill tokens/s by prompt length, against what exact attention allows.

Each size is a new conversation's first turn of that many tokens (whole blocks, as the follow-ups'
contexts) under `recompute`, one reply token: its client TTFT is the prompt's prefill (chunks of
the compute node's max_num_batched_tokens) and the first token. Every size is measured once per
round, the sizes in turn (shortest first, then longest first in the next round), so they are side
by side under the same load; tokens/s is of each size's fastest round (others' load on a shared
machine only ever slows a round down; the median is kept beside it). A turn that reused any KV (its
record's tokens_reused) or prefilled other than the whole prompt fails its size.

Attention is exact, so a long prompt's tokens cost more: a token at position p adds
4 * layers * heads * head_dim * p FLOPs of attention to the 2 * (weights of the layers) FLOPs of its
projections and MLP. `exact_attention_bound` is the tokens/s ratio of two prompt lengths when every
FLOP runs at one rate; `prefill_vs_exact_attention_bound_<n>` is the measured ratio over it (1: the
long prompt's attention runs at the matrix products' FLOP rate).
"""
from __future__ import annotations

import logging

from bench.results import fail, format_table
from bench.stats import ratio, summarize

logger = logging.getLogger(__name__)

SIZES = (512, 1024, 2048, 4096, 6000)
SMOKE_SIZES = (64, 160)
FLOOR = 0.9  # prefill_vs_exact_attention_bound_<largest>: within 10% of the FLOP bound


def flops_per_token(config, tokens: int) -> float:
    """Mean FLOPs per token of prefilling `tokens` tokens (the LM head, run for the last one only,
    left out): the layers' matrix products, and attention over keys 1..tokens."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    weights = layers * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
                        + 3 * hidden * config.intermediate_size)
    return 2 * weights + 4 * layers * heads * head_dim * (tokens + 1) / 2


def exact_attention_bound(config, small: int, large: int) -> float:
    """large's prefill tokens/s over small's when every FLOP runs at one rate."""
    return flops_per_token(config, small) / flops_per_token(config, large)


def run_prefill(result: dict, stub, sizes: list[int], reps: int, progress, prompt_of, generate, user: str) -> dict:
    """{size: row}: each size's first turns, `reps` rounds of every size. prompt_of(size) -> token ids;
    generate(stub, user, context, ids, max_new, policy) -> bench.turns.TurnResult. A size whose turn
    raises or reuses KV is recorded in result["failed"] (part "prefill <size> tokens") and its row
    has `failed`."""
    prompts, turns, rows = {}, {n: [] for n in sizes}, {}
    for n in sizes:
        try:
            prompts[n] = prompt_of(n)
        except Exception as exc:  # noqa: BLE001 - a failed size is reported with its error
            rows[str(n)] = {"failed": fail(result, f"prefill {n} tokens", exc)["error"]}
    for rep in range(reps):
        for n, ids in sorted(prompts.items(), reverse=rep % 2 == 1):
            if str(n) in rows:
                continue
            try:
                turn = generate(stub, user, f"prefill-{n}-{rep}", ids, 1, "recompute")
                if turn.record.tokens_reused or turn.record.tokens_prefilled != len(ids):
                    raise RuntimeError(f"the turn reused {turn.record.tokens_reused} tokens and prefilled "
                                       f"{turn.record.tokens_prefilled} of {len(ids)}")
            except Exception as exc:  # noqa: BLE001 - a failed size is reported with its error
                rows[str(n)] = {"failed": fail(result, f"prefill {n} tokens", exc)["error"]}
                continue
            turns[n].append(turn)
            progress.update(note=f"prefill {n} tokens")
    for n, ids in prompts.items():
        if str(n) not in rows:
            ttft = [t.ttft_s for t in turns[n]]
            rows[str(n)] = {"prompt_tokens": len(ids), "ttft_s": summarize(ttft), "ttft_samples_s": ttft,
                            "engine_ttft_ms": [t.record.ttft_ms for t in turns[n]],
                            "tokens_per_s": len(ids) / min(ttft)}
    return rows


def model_config():
    """The served model's transformers config (the compute node's default model_cache_dir)."""
    from transformers import AutoConfig

    from compute_node.settings import ComputeSettings
    return AutoConfig.from_pretrained(ComputeSettings().model_cache_dir)


def add_ratios(result: dict, config) -> dict[str, float]:
    """prefill_tokens_per_s_<n>_vs_<smallest> for each size, the exact-attention bound beside it
    (results.prefill_bound) and prefill_vs_exact_attention_bound_<n>; returns the floor on the largest."""
    rows = result["results"].get("prefill") or {}
    measured = [size for size, row in rows.items() if "tokens_per_s" in row]
    if len(measured) < 2:
        return {}
    small = measured[0]
    bounds = result["results"]["prefill_bound"] = {}
    for size in measured[1:]:
        key = f"{size}_vs_{small}"
        got = ratio(rows[size]["tokens_per_s"], rows[small]["tokens_per_s"])
        bounds[key] = exact_attention_bound(config, rows[small]["prompt_tokens"], rows[size]["prompt_tokens"])
        result["ratios"][f"prefill_tokens_per_s_{key}"] = got
        result["ratios"][f"prefill_vs_exact_attention_bound_{size}"] = got / bounds[key]
    return {f"prefill_vs_exact_attention_bound_{measured[-1]}": FLOOR}


def table(result: dict) -> str:
    rows = result["results"].get("prefill") or {}
    if not rows:
        return ""
    bounds = result["results"].get("prefill_bound") or {}
    small = next((size for size, row in rows.items() if "tokens_per_s" in row), None)
    lines = []
    for size, row in rows.items():
        if "tokens_per_s" not in row:
            lines.append([size, "-", f"failed: {row['failed'][:200]}", "", "", "", ""])
            continue
        key = f"{size}_vs_{small}"
        vs = result["ratios"].get(f"prefill_tokens_per_s_{key}", 1.0)
        lines.append([size, row["prompt_tokens"], f"{row['ttft_s']['min'] * 1e3:.0f}",
                      f"{row['ttft_s']['p50'] * 1e3:.0f}", f"{row['tokens_per_s']:.1f}",
                      f"{vs:.2f}", f"{bounds.get(key, 1.0):.2f}"])
    head = ["size", "tokens", "best TTFT ms", "median ms", "prefill tokens/s (best)", f"vs {small}",
            "exact-attention bound"]
    return f"prefill of a new prompt (recompute, 1 reply token)\n{format_table(head, lines)}"
