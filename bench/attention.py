"""`kvtb bench attention`: a short prefill chunk's attention, the compiled kernel against torch's, by depth.

A chunk of k new tokens at the end of a context of C tokens (a follow-up's new prompt after its restored
context, or a long prompt's chunk capped by the compute node's step budget) is attended either by the
compiled kernel (compute_node._attention: each new token reads its keys from the pool alone) or by torch
(the chunk's blocks gathered once, then one scaled_dot_product_attention with a causal mask). Over a pool
of random KV in SmolLM2-135M's shape (30 layers, 3 KV heads, 9 query heads, 64 dims), for each C and k,
both run side by side in the same rounds, all layers of one step each; the best of --rounds is kept.
`kernel_vs_torch_<C>_<k>` is the kernel's time over torch's (above 1: torch is faster). The compute node
sends chunks of up to compute_node.paged_attention.KERNEL_MAX_CHUNK tokens to the kernel.
"""
from __future__ import annotations

import argparse
import logging
import time

import torch

from bench.results import add_common_args, finish, format_table, new_result, setup_logging

logger = logging.getLogger(__name__)

LAYERS, KV_HEADS, HEADS, HEAD_DIM = 30, 3, 9, 64  # SmolLM2-135M


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 7000], help="context tokens C")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64], help="new tokens k")
    parser.add_argument("--block-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch-threads", type=int, default=1)
    add_common_args(parser, "attention")
    args = parser.parse_args(argv)
    if args.smoke:
        args.contexts, args.chunks, args.rounds = [96], [1, 4], 2
    if min(args.chunks) < 1 or any(k > c for c in args.contexts for k in args.chunks) or args.rounds < 1:
        parser.error("every chunk must be 1 .. the smallest context, and --rounds at least 1")
    return args


class _Runner:
    """What AttentionPlan's torch path reads from a Llama: the pool and a reused gather buffer."""

    def __init__(self, pool: torch.Tensor, block_tokens: int):
        self.pool, self.block_tokens, self.head_dim = pool, block_tokens, HEAD_DIM
        self.workspace = torch.empty(0)

    def gather_buffer(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.workspace.numel() < numel or self.workspace.dtype != dtype:
            self.workspace = torch.empty(numel, dtype=dtype)
        return self.workspace[:numel]


def measure(context: int, chunk: int, block_tokens: int, rounds: int) -> dict[str, float]:
    """Best seconds of one step's attention over every layer, for the kernel and for torch."""
    from compute_node import paged_attention as pa
    blocks = -(-context // block_tokens)
    generator = torch.Generator().manual_seed(context * 1000 + chunk)
    pool = torch.randn(blocks, LAYERS, 2, KV_HEADS, block_tokens, HEAD_DIM, generator=generator) * 0.1
    runner = _Runner(pool, block_tokens)
    q = torch.randn(chunk, HEADS, HEAD_DIM, generator=generator)
    table = torch.arange(blocks, dtype=torch.int32)[None, :]
    cached = context - chunk
    kernel = pa.KernelTokens(None, table.repeat(chunk, 1).contiguous(),
                             torch.arange(cached + 1, context + 1, dtype=torch.int64))
    prefill = pa.Prefill(0, chunk, pa.Gather(pa.block_rows(table.long(), LAYERS, KV_HEADS), context),
                         pa.prefill_mask(cached, context, "cpu"))
    ways = {"kernel": lambda layer: kernel.attend(pool, layer, q),
            "torch": lambda layer: pa.AttentionPlan._prefill(runner, layer, prefill, q, None, None)}
    best = {name: float("inf") for name in ways}
    for _ in range(rounds):
        for name, attend in ways.items():
            started = time.perf_counter()
            for layer in range(LAYERS):
                attend(layer)
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging(args)
    from compute_node.paged_attention import KERNEL_MAX_CHUNK, kernel_built
    if not kernel_built():
        raise SystemExit("kvtb bench attention: the compiled kernel is not built (make install builds it)")
    torch.set_num_threads(args.torch_threads)
    rows, ratios = [], {}
    for context in args.contexts:
        for chunk in args.chunks:
            best = measure(context, chunk, args.block_tokens, args.rounds)
            ratio = best["kernel"] / best["torch"]
            ratios[f"kernel_vs_torch_{context}_{chunk}"] = round(ratio, 3)
            rows.append({"context": context, "chunk": chunk, "kernel_ms": best["kernel"] * 1e3,
                         "torch_ms": best["torch"] * 1e3, "kernel_vs_torch": ratio})
    result = new_result("attention", {"contexts": args.contexts, "chunks": args.chunks, "rounds": args.rounds,
                                      "block_tokens": args.block_tokens, "torch_threads": args.torch_threads,
                                      "kernel_max_chunk": KERNEL_MAX_CHUNK})
    result["results"] = {"rows": rows}
    result["ratios"] = ratios
    finish(args, result, render(result))
    return 0


def render(result: dict) -> str:
    rows = [[r["context"], r["chunk"], f"{r['kernel_ms']:.1f}", f"{r['torch_ms']:.1f}", f"{r['kernel_vs_torch']:.2f}"]
            for r in result["results"]["rows"]]
    return (format_table(["context", "new tokens", "kernel ms", "torch ms", "kernel / torch"], rows)
            + f"\nchunks of up to {result['settings']['kernel_max_chunk']} new tokens go to the kernel "
              "(compute_node.paged_attention.KERNEL_MAX_CHUNK); the rest to torch")
